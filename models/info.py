"""Describe a preset or checkpoint: config, parameter count and every hook with its shape.

    python -m models.info --list-presets
    python -m models.info --preset tiny_shakespeare_gpt_small
    python -m models.info --preset tiny_shakespeare_gpt_small --save runs/demo/step_000000
    python -m models.info --ckpt runs/demo --json

Hook shapes come from one ``run_with_cache`` on a short dummy input (``min(n_ctx, 8)`` tokens;
the MLP family needs a full window of ``n_ctx``). Per-head ``hook_result`` is switched on so its
shape is listed too. A checkpoint we read but never rebuilt prints its own shape (a Hugging Face
model's through TransformerBridge, with the bridge's hooks; nanochat's, whose GPT has no hook points,
with the attention calls the tap reads instead). Errors print one ``error: ...`` line on stderr
and exit with code 2.
"""

from __future__ import annotations

if __name__ == "__main__":  # Ctrl-C/SIGTERM: one line from here on; --help and bad arguments
    from models.interrupts import quiet_signals  # answered before torch is imported (~4 s)
    quiet_signals()
    from models.parsers import info_parser
    info_parser().parse_early()

import argparse
import json
import logging
from pathlib import Path
from typing import Any

import torch

from models import PRESETS, build_model, get_preset
from models.checkpoint import load_from_args, save_snapshot
from models.cli import run_cli
from models.layout import parameter_count
from models.parsers import CHAR_ALPHABET, DEFAULT_SEQ_LEN, SHAKESPEARE_CHARS  # noqa: F401  (re-exported)
from models.parsers import info_parser as build_parser
from models.store.any_model import SavedModel
from models.tokenizers import CharTokenizer


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


def attention_calls(model: torch.nn.Module, tokens: torch.Tensor) -> dict[str, dict[str, Any]]:
    """Each attention call the tap reads in one forward of a model without hook points (its module
    name -> pattern shape [batch head q k] and how it is made: sdpa, softmax or heads)."""
    from models.tap import tap_forward

    ids = tokens.to(next(model.parameters()).device)
    result = tap_forward(model, ids, lambda call: list(call.pattern.shape))
    return {name: {"pattern": shape, "kind": kind}
            for (name, shape), kind in zip(result.layers, result.kinds)}


def describe(model: torch.nn.Module, name: str, *, hooks: bool = True, seq_len: int | None = None,
             extra: dict[str, Any] | None = None, config: Any = None) -> dict[str, Any]:
    """The JSON-ready description printed by ``--json``. `config` is the checkpoint's own (a
    TransformerBridge's or nanochat's shape in our words); ours by default."""
    cfg = config if config is not None else model.cfg
    info: dict[str, Any] = {"name": name, "family": cfg.family, "config": cfg.to_dict(),
                            "n_params": parameter_count(model), **(extra or {})}
    if hooks:
        tokens = dummy_tokens(cfg, seq_len)
        info["dummy_input_shape"] = list(tokens.shape)
        if hasattr(model, "run_with_cache"):
            info["hooks"] = hook_shapes(model, tokens)
        elif isinstance(model, SavedModel):  # a snapshot of any model without its code: its layout
            del info["dummy_input_shape"]
            info["layout"] = model.layout.to_dict()
        else:  # nanochat's GPT: no hook points at all, the attention calls the tap reads instead
            info["attention_calls"] = attention_calls(model, tokens)
    return info


def format_text(info: dict[str, Any]) -> str:
    lines = [f"{info['name']}  ({info['family']}, {info['n_params']:,} parameters)"]
    for key in ("step", "tokens_seen", "tokenizer", "nonfinite_params", "saved"):
        if info.get(key) is not None:
            lines.append(f"{key}: {info[key]}")
    lines.append("config:")
    width = max(len(k) for k in info["config"])
    lines += [f"  {key:<{width}}  {value}" for key, value in info["config"].items()]
    if "attention_calls" in info:
        calls = info["attention_calls"]
        lines.append("attention calls the tap reads (no hook points; on a "
                     f"{info['dummy_input_shape']} dummy input):")
        width = max((len(k) for k in calls), default=0)
        lines += [f"  {name:<{width}}  {call['pattern']}  {call['kind']}" for name, call in calls.items()]
    if "layout" in info:
        lines.append("layout (saved with the snapshot; its code is not needed to read it):")
        layout = info["layout"]
        for part in ("token_embedding", "position_embedding", "blocks", "final_norm", "unembedding"):
            lines.append(f"  {part:<18}  {layout.get(part) or 'not found: ' + layout['missing'].get(part, '')}")
    if "hooks" in info:
        lines.append(f"hooks (shapes on a {info['dummy_input_shape']} dummy input):")
        width = max(len(k) for k in info["hooks"])
        for key, shape in info["hooks"].items():
            lines.append(f"  {key:<{width}}  {shape if shape is not None else '(not fired)'}")
    return "\n".join(lines)


def list_presets_info() -> list[dict[str, Any]]:
    return [{"name": p.name, "family": p.config.family, "description": p.description}
            for p in PRESETS.values()]


def _run(args: argparse.Namespace) -> dict[str, Any] | list[dict[str, Any]]:
    if args.list_presets:
        return list_presets_info()
    extra: dict[str, Any] = {}  # --preset or --ckpt, and --save without --ckpt: see info_parser
    config = None
    if args.ckpt is not None:
        snap = load_from_args(args)
        config = snap.config
        model, name = snap.model, snap.name
        tok = snap.tokenizer
        extra = {"path": str(snap.path), "step": snap.step, "tokens_seen": snap.tokens_seen,
                 "tokenizer": None if tok is None else {"kind": tok.kind, "vocab_size": tok.vocab_size},
                 "nonfinite_params": snap.nonfinite_params()}
    else:
        if args.save and Path(args.save).exists():  # a fresh random model never replaces a trained one
            raise ValueError(f"--save {args.save} already exists: give a new directory (nothing was "
                             f"written)")
        cfg = get_preset(args.preset)
        tokenizer = char_tokenizer_for(cfg.d_vocab) if args.save else None
        torch.manual_seed(args.seed)
        model, name = build_model(cfg).eval(), args.preset
        if args.save:
            path = save_snapshot(args.save, model, tokenizer,
                                 train_config={"preset": args.preset, **PRESETS[args.preset].train})
            extra["saved"] = str(path)
    return describe(model, name, hooks=args.hooks, seq_len=args.seq_len, extra=extra, config=config)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")

    def body() -> int:
        args = build_parser().parse_args(argv)
        return _print(args, _run(args))

    return run_cli(body)


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
    from models.cli import exit_entry
    exit_entry(main())
