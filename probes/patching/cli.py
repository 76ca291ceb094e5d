"""The command line of `python -m probes.patching` (its parser: `probes.patching_args`)."""

from __future__ import annotations

from typing import Any

from probes.cli import run_probe
from probes.common import no_tokenizer, refused, sample_only
from probes.patching_args import patching_parser as build_parser


def runnable(args: Any) -> Any:
    """The snapshot --ckpt names, refused in one line where its model cannot run (a snapshot of any
    model opened without --model-code holds its readings only)."""
    from models.checkpoint import load_from_args
    snap = load_from_args(args)
    if sample_only(snap):
        raise refused(snap.model)
    return snap


def main(argv: list[str] | None = None) -> int:
    return run_probe(build_parser, argv, from_args)


def from_args(args: Any) -> Any:
    from probes.patching.runner import run
    snap = runnable(args)
    if snap.tokenizer is None:
        no_tokenizer(snap)
    return run(snap.model, args.clean, args.corrupt, answer=args.answer, wrong=args.wrong, what=args.what,
               by_position=args.by_position, method=args.method,
               direction="noise" if args.noise else "denoise", batch=args.batch, atp_star=args.atp_star,
               tokenizer=snap.tokenizer)
