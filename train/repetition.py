"""A run that shows a phase change in seconds on a CPU: a 2-layer attention-only transformer learning
in-context repetition (random segments of a random period repeated to fill the context) forms
induction heads in layer 1, and the loss on the repeated part drops as they form (Olsson et al. 2022).

    python -m train.repetition --out runs/induction          # ~15 s; then
    python -m probes.development --ckpt runs/induction        # or the app's Development page
    streamlit run app/main.py -- --runs runs/induction

The shipped `checkpoints/induction` is this command with a wider model, 4 heads and a longer context
(its command is in checkpoints/README.md). The run is ours, written by the Monitor (`train.monitor`,
as `python -m train` writes its runs): step_* snapshots every --every steps, metrics.jsonl with the
train loss, g/w/u and attention internals, and at each snapshot `val_loss`, the held-out loss on the
repeated part; run.json. Its text (`data.txt`, rows of repeated segments over a 32-character
alphabet, drawn as the training rows are) is recorded, so the probes read windows of it. The loss is
taken on the repeated targets only (the rest cannot be predicted), so the loss on a row's first,
unrepeated period grows as the model learns to copy.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from models import build_model
from train.records import portable_path
from models.config import TransformerConfig

__all__ = ["ALPHABET", "attention_only", "build_parser", "main", "repetition_batch", "repetition_config",
           "train"]

ALPHABET = "abcdefghijklmnopqrstuvwxyz012345"  # 32 characters, one token each
N_CTX = 24
BATCH = 32  # training rows per step
HELD_OUT = 64  # held-out rows the val loss (and the Monitor's internals) read


def attention_only(cfg: TransformerConfig) -> torch.nn.Module:
    """Our transformer with its MLPs (d_mlp 1, no bias) zeroed and frozen: attention only."""
    model = build_model(cfg)
    for block in model.blocks:
        for p in block.mlp.parameters():
            p.data.zero_()
            p.requires_grad_(False)
    return model


def repetition_config(n_ctx: int = N_CTX, width: int = 32, n_heads: int = 2) -> TransformerConfig:
    """The 2-layer attention-only model's config (heads of width // n_heads)."""
    return TransformerConfig(d_vocab=len(ALPHABET), n_ctx=n_ctx, d_model=width, n_layers=2, n_heads=n_heads,
                             d_head=width // n_heads, d_mlp=1, mlp_bias=False, attn_scale="sqrt_d_head",
                             unembed_init_scale=0.01)


def repetition_batch(batch: int, n_ctx: int, d_vocab: int, gen: torch.Generator,
                     shortest: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [batch n_ctx+1], repeated [batch n_ctx]): each row a random segment of a random period
    in [shortest, n_ctx // 2] repeated to fill the row; repeated[b, i]: target i+1 is a repeat."""
    period = torch.randint(shortest, n_ctx // 2 + 1, (batch, 1), generator=gen)  # [batch 1]
    segment = torch.randint(0, d_vocab, (batch, n_ctx + 1), generator=gen)
    position = torch.arange(n_ctx + 1)
    return segment.gather(1, position % period), position[1:] >= period


def repeated_loss(model: torch.nn.Module, tokens: torch.Tensor, repeated: torch.Tensor) -> torch.Tensor:
    """The mean loss on the targets that repeat: tokens [batch n_ctx+1], repeated [batch n_ctx]."""
    logits = model(tokens[:, :-1])  # [batch n_ctx vocab]
    return F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")[repeated].mean()


def train(run_dir: Path, *, steps: int = 300, every: int = 15, lr: float = 5e-3, seed: int = 0, n_ctx: int = N_CTX,
          width: int = 32, n_heads: int = 2, tokenizer=None, run_info: dict[str, Any] | None = None,
          report: bool = False) -> tuple[torch.Tensor, list[tuple[int, float]]]:
    """Train the model through a Monitor writing `run_dir` (a snapshot every `every` steps, a record
    every `every` // 3). Returns held-out windows [64 n_ctx] and, per snapshot, (step, the held-out
    loss on their repeated part). `run_info` is added to the Monitor's run.json; `report` prints the
    doctor's diagnosis at the end."""
    from models.store.run import read_run_json, write_run_json
    from train.monitor import Monitor

    torch.manual_seed(seed)
    cfg = repetition_config(n_ctx, width, n_heads)
    model = attention_only(cfg)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    data = torch.Generator().manual_seed(seed + 1)
    held, held_repeated = repetition_batch(HELD_OUT, n_ctx, cfg.d_vocab, torch.Generator().manual_seed(seed + 2))
    measured = []

    def held_out(step: int) -> float:
        with torch.no_grad():
            measured.append((step, float(repeated_loss(model, held, held_repeated))))
        return measured[-1][1]

    with Monitor(model, opt, run_dir, log_every=max(1, every // 3), eval_every=every, eval_tokens=held[:, :n_ctx],
                 save_every=every, tokenizer=tokenizer, steps=steps, start_step=1,  # a step is numbered once taken
                 tokens_per_step=BATCH * n_ctx, report=report) as monitor:
        if run_info:
            write_run_json(run_dir, {**read_run_json(run_dir), **run_info})
        monitor.record(0, tokens=0, val_loss=held_out(0))
        monitor.flush()
        monitor.save(0)
        for step in range(1, steps + 1):
            loss = repeated_loss(model, *repetition_batch(BATCH, n_ctx, cfg.d_vocab, data))
            opt.zero_grad()
            loss.backward()
            opt.step()
            monitor.log(step, train_loss=loss.detach(), **({"val_loss": held_out(step)} if step % every == 0 else {}))
    return held[:, :n_ctx], measured


def page_text(n_ctx: int, seed: int = 0) -> str:
    """The text the run's pages open on: n_ctx // 2 distinct characters, then the same again (a repeat
    the induction heads complete, one the Patching page corrupts)."""
    segment = torch.randperm(len(ALPHABET), generator=torch.Generator().manual_seed(seed))[:min(n_ctx // 2, len(ALPHABET))]
    return "".join(ALPHABET[i] for i in segment.tolist()) * 2


def write_page_view(run_dir: Path, n_ctx: int) -> None:
    """The first view of the run's last snapshot on `page_text` (the Monitor writes one on the sidebar's
    Shakespeare, which this alphabet cannot spell), so the app's pages open on a repeat."""
    from models.checkpoint import load_checkpoint
    from probes.page_view import save_first_view

    snap = load_checkpoint(run_dir)
    text = page_text(n_ctx)[:n_ctx]
    save_first_view(snap.path, snap.model, snap.tokenizer, torch.tensor([snap.tokenizer.encode(text)]), text)


class _NoShakespeareView(logging.Filter):
    """Drops the Monitor's "no first view" line at every snapshot: `write_page_view` writes one at the end."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "no first view" not in record.getMessage()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m train.repetition", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="run directory to create")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps (default 300)")
    parser.add_argument("--every", type=int, default=15, help="a snapshot every N steps (default 15)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the data (default 0)")
    parser.add_argument("--n-ctx", type=int, default=N_CTX, help=f"context in tokens (default {N_CTX})")
    parser.add_argument("--width", type=int, default=32, help="d_model (default 32)")
    parser.add_argument("--heads", type=int, default=2, help="heads per layer, each width / heads wide (default 2)")
    parser.add_argument("--lr", type=float, default=5e-3, help="Adam's learning rate (default 5e-3)")
    return parser


def check_args(args: argparse.Namespace) -> str | None:
    """What is wrong with the command line, in one line, or None."""
    if args.out.exists():
        return f"{args.out} exists; give a new --out"
    for name in ("steps", "every", "n_ctx", "width", "heads"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}"
    if args.width % args.heads:
        return f"--width {args.width} is not a multiple of --heads {args.heads}"
    if args.n_ctx < 6:
        return f"--n-ctx {args.n_ctx} leaves no room for a repeat (at least 6)"
    return None


def main(argv: list[str] | None = None) -> int:
    from models.tokenizers import CharTokenizer

    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    problem = check_args(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    args.out.mkdir(parents=True)
    chars = CharTokenizer(list(ALPHABET))  # token i is ALPHABET[i]
    rows, _ = repetition_batch(4000, args.n_ctx, len(ALPHABET), torch.Generator().manual_seed(args.seed + 3))
    text = chars.decode(rows.flatten().tolist())
    (args.out / "data.txt").write_text(text)
    info = {"command": "python -m train.repetition " + " ".join(argv),
            # where the run's text is, as python -m train records its --data: relative to where it ran
            "data": {"path": portable_path(args.out / "data.txt"), "sha256": hashlib.sha256(text.encode()).hexdigest()},
            "tokenizer": {"kind": chars.kind, "vocab_size": chars.vocab_size}}
    quiet = _NoShakespeareView()
    logging.getLogger("train.monitor").addFilter(quiet)
    try:
        _, measured = train(args.out, steps=args.steps, every=args.every, lr=args.lr, seed=args.seed,
                            n_ctx=args.n_ctx, width=args.width, n_heads=args.heads, tokenizer=chars, run_info=info,
                            report=True)
    finally:
        logging.getLogger("train.monitor").removeFilter(quiet)
    write_page_view(args.out, args.n_ctx)
    print(f"{args.out}: {len(measured)} snapshots; held-out loss on the repeated part "
          + " ".join(f"{s}:{v:.2f}" for s, v in measured))
    return 0


if __name__ == "__main__":
    sys.exit(main())
