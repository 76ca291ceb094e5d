"""The command line of `python -m probes.patching` (its parser: `probes.patching_args`)."""

from __future__ import annotations

from probes.common import no_tokenizer, print_json, refused, run_cli, sample_only
from probes.patching_args import patching_parser as build_parser


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        args = build_parser().parse_args(argv)
        from models.checkpoint import load_from_args
        from probes.patching.runner import run
        snap = load_from_args(args)
        if sample_only(snap):
            raise refused(snap.model)
        if snap.tokenizer is None:
            no_tokenizer(snap)
        result = run(snap.model, args.clean, args.corrupt, answer=args.answer, wrong=args.wrong, what=args.what,
                     by_position=args.by_position, method=args.method,
                     direction="noise" if args.noise else "denoise", batch=args.batch, atp_star=args.atp_star,
                     tokenizer=snap.tokenizer)
        if args.json:
            print_json(result.to_dict())
        else:
            print(result.format())
        return 0

    return run_cli(body)
