"""Describe a preset or checkpoint: config, parameter count and every hook with its shape.

    python -m models.info --list-presets
    python -m models.info --preset tiny_shakespeare_gpt_small
    python -m models.info --preset tiny_shakespeare_gpt_small --save runs/demo/step_000000
    python -m models.info --ckpt runs/demo --json

Hook shapes come from one ``run_with_cache`` on a short dummy input (``min(n_ctx, 8)`` tokens;
the MLP family needs a full window of ``n_ctx``). Per-head ``hook_result`` is switched on so its
shape is listed too. Errors print one ``error: ...`` line on stderr and exit with code 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import string
import sys
from typing import Any

import torch

from models import PRESETS, build_model, get_preset
from models.checkpoint import add_ckpt_arguments, load_from_args, save_snapshot
from models.tokenizers import CharTokenizer
from models.cli import run_cli

# Tiny Shakespeare's 65 characters first (so d_vocab=65 gives exactly its vocabulary), then the
# rest of printable ASCII: 96 characters in all.
SHAKESPEARE_CHARS = "\n !$&',-.3:;?" + string.ascii_uppercase + string.ascii_lowercase
CHAR_ALPHABET = SHAKESPEARE_CHARS + "".join(
    c for c in string.printable if c not in SHAKESPEARE_CHARS and c not in "\t\r\x0b\x0c")
DEFAULT_SEQ_LEN = 8


def char_tokenizer_for(d_vocab: int) -> CharTokenizer:
    """A character tokenizer over the first ``d_vocab`` characters of CHAR_ALPHABET."""
    if d_vocab > len(CHAR_ALPHABET):
        raise ValueError(f"--save builds a character vocabulary of at most {len(CHAR_ALPHABET)} "
                         f"characters, but this model has d_vocab={d_vocab}; train a tokenizer "
                         "(models.tokenizers.BPETokenizer.train) and call "
                         "models.checkpoint.save_snapshot instead")
    return CharTokenizer.from_text(CHAR_ALPHABET[:d_vocab])


def dummy_tokens(cfg: Any, seq_len: int | None = None) -> torch.Tensor:
    """[1 pos] token ids 0, 1, 2, ... (mod d_vocab); the MLP family gets at least n_ctx tokens."""
    if seq_len is None:
        seq_len = cfg.n_ctx if cfg.family == "mlp" else min(cfg.n_ctx, DEFAULT_SEQ_LEN)
    return (torch.arange(seq_len) % cfg.d_vocab).unsqueeze(0)


def hook_shapes(model: torch.nn.Module, tokens: torch.Tensor) -> dict[str, list[int] | None]:
    """Every hook name -> the shape it produced on ``tokens`` (None if it did not fire)."""
    if hasattr(model, "set_use_attn_result"):
        model.set_use_attn_result(True)
    try:
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens.to(next(model.parameters()).device))
    finally:
        if hasattr(model, "set_use_attn_result"):
            model.set_use_attn_result(False)
    shapes: dict[str, list[int] | None] = {name: list(cache[name].shape) for name in cache.keys()}
    for name in model.hook_dict:
        shapes.setdefault(name, None)
    return shapes


def describe(model: torch.nn.Module, name: str, *, hooks: bool = True, seq_len: int | None = None,
             extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON-ready description printed by ``--json``."""
    cfg = model.cfg
    info: dict[str, Any] = {"name": name, "family": cfg.family, "config": cfg.to_dict(),
                            "n_params": sum(p.numel() for p in model.parameters()), **(extra or {})}
    if hooks:
        tokens = dummy_tokens(cfg, seq_len)
        info["dummy_input_shape"] = list(tokens.shape)
        info["hooks"] = hook_shapes(model, tokens)
    return info


def format_text(info: dict[str, Any]) -> str:
    lines = [f"{info['name']}  ({info['family']}, {info['n_params']:,} parameters)"]
    for key in ("step", "tokens_seen", "tokenizer", "nonfinite_params", "saved"):
        if info.get(key) is not None:
            lines.append(f"{key}: {info[key]}")
    lines.append("config:")
    width = max(len(k) for k in info["config"])
    lines += [f"  {key:<{width}}  {value}" for key, value in info["config"].items()]
    if "hooks" in info:
        lines.append(f"hooks (shapes on a {info['dummy_input_shape']} dummy input):")
        width = max(len(k) for k in info["hooks"])
        for key, shape in info["hooks"].items():
            lines.append(f"  {key:<{width}}  {shape if shape is not None else '(not fired)'}")
    return "\n".join(lines)


def list_presets_info() -> list[dict[str, Any]]:
    return [{"name": p.name, "family": p.config.family, "description": p.description}
            for p in PRESETS.values()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m models.info", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_ckpt_arguments(parser, required=False)
    parser.add_argument("--list-presets", action="store_true", help="list the preset names and exit")
    parser.add_argument("--hooks", action=argparse.BooleanOptionalAction, default=True,
                        help="run a dummy input and list every hook with its shape (default: on)")
    parser.add_argument("--seq-len", type=int, metavar="N",
                        help=f"dummy input length (default: min(n_ctx, {DEFAULT_SEQ_LEN}); "
                             "n_ctx for MLPs)")
    parser.add_argument("--save", metavar="DIR",
                        help="save the freshly built --preset as a snapshot in DIR (char vocabulary "
                             f"of d_vocab characters; d_vocab <= {len(CHAR_ALPHABET)})")
    parser.add_argument("--seed", type=int, default=0, help="torch seed for building a preset")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON to stdout")
    return parser


def _run(args: argparse.Namespace) -> dict[str, Any] | list[dict[str, Any]]:
    if args.list_presets:
        return list_presets_info()
    if args.ckpt is None and args.preset is None:
        raise ValueError("give --preset NAME or --ckpt PATH (or --list-presets)")
    if args.seq_len is not None and args.seq_len < 1:
        raise ValueError(f"--seq-len must be >= 1, got {args.seq_len}")
    extra: dict[str, Any] = {}
    if args.ckpt is not None:
        if args.save:
            raise ValueError("--save saves a freshly built --preset; leave out --ckpt")
        snap = load_from_args(args)
        model, name = snap.model, snap.name
        tok = snap.tokenizer
        extra = {"path": str(snap.path), "step": snap.step, "tokens_seen": snap.tokens_seen,
                 "tokenizer": None if tok is None else {"kind": tok.kind, "vocab_size": tok.vocab_size},
                 "nonfinite_params": snap.nonfinite_params()}
    else:
        cfg = get_preset(args.preset)
        tokenizer = char_tokenizer_for(cfg.d_vocab) if args.save else None
        torch.manual_seed(args.seed)
        model, name = build_model(cfg).eval(), args.preset
        if args.save:
            path = save_snapshot(args.save, model, tokenizer,
                                 train_config={"preset": args.preset, **PRESETS[args.preset].train})
            extra["saved"] = str(path)
    return describe(model, name, hooks=args.hooks, seq_len=args.seq_len, extra=extra)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    return run_cli(lambda: _print(args, _run(args)))


def _print(args: argparse.Namespace, result: dict[str, Any] | list[dict[str, Any]]) -> int:
    if args.json:
        text = json.dumps(result, indent=2)
    elif isinstance(result, list):
        width = max(len(p["name"]) for p in result)
        text = "\n".join(f"{p['name']:<{width}}  {p['family']:<11}  {p['description']}" for p in result)
    else:
        text = format_text(result)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
