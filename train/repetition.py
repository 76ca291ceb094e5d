"""A run that shows a phase change in seconds on a CPU: a 2-layer attention-only transformer learning
in-context repetition (random segments of a random period repeated to fill the context) forms
induction heads in layer 1, and the loss on the repeated part drops as they form (Olsson et al. 2022).

    python -m train.repetition --out runs/induction          # ~10 s; then
    python -m probes.development --ckpt runs/induction        # or the app's Development page
    streamlit run app/main.py -- --runs runs/induction

The run is ours (step_* snapshots every --every steps, metrics.jsonl with the train loss and, at each
snapshot, the held-out loss on the repeated part, run.json); its text (`data.txt`, rows of repeated
segments over a 32-character alphabet, drawn as the training rows are) is recorded, so the probes
read windows of it. The loss is taken on the repeated targets only (the rest cannot be predicted),
so the loss on a row's first, unrepeated period grows as the model learns to copy.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from models import build_model
from models.config import TransformerConfig

__all__ = ["ALPHABET", "attention_only", "build_parser", "main", "repetition_batch", "train"]

ALPHABET = "abcdefghijklmnopqrstuvwxyz012345"  # 32 characters, one token each
N_CTX = 24


def attention_only(cfg: TransformerConfig) -> torch.nn.Module:
    """Our transformer with its MLPs (d_mlp 1, no bias) zeroed and frozen: attention only."""
    model = build_model(cfg)
    for block in model.blocks:
        for p in block.mlp.parameters():
            p.data.zero_()
            p.requires_grad_(False)
    return model


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
          width: int = 32, tokenizer=None, log=None) -> tuple[torch.Tensor, list[tuple[int, float]]]:
    """Train the model, a snapshot every `every` steps into `run_dir`. Returns held-out windows
    [64 n_ctx] and, per snapshot, (step, the held-out loss on their repeated part)."""
    from models.checkpoint import save_snapshot, snapshot_name

    torch.manual_seed(seed)
    cfg = TransformerConfig(d_vocab=len(ALPHABET), n_ctx=n_ctx, d_model=width, n_layers=2, n_heads=2,
                            d_head=width // 2, d_mlp=1, mlp_bias=False, attn_scale="sqrt_d_head",
                            unembed_init_scale=0.01)
    model = attention_only(cfg)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    data = torch.Generator().manual_seed(seed + 1)
    held, held_repeated = repetition_batch(64, n_ctx, cfg.d_vocab, torch.Generator().manual_seed(seed + 2))
    measured = []
    for step in range(steps + 1):
        if step % every == 0:
            save_snapshot(run_dir / snapshot_name(step), model, tokenizer, step=step)
            with torch.no_grad():
                measured.append((step, float(repeated_loss(model, held, held_repeated))))
        if step == steps:
            break
        loss = repeated_loss(model, *repetition_batch(32, n_ctx, cfg.d_vocab, data))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if log is not None:
            log(step, loss.item(), measured[-1][1] if step % every == 0 else None)
    return held[:, :n_ctx], measured


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m train.repetition", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="run directory to create")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps (default 300)")
    parser.add_argument("--every", type=int, default=15, help="a snapshot every N steps (default 15)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the data (default 0)")
    return parser


def main(argv: list[str] | None = None) -> int:
    from models.checkpoint import append_metrics, write_run_json
    from models.tokenizers import CharTokenizer

    args = build_parser().parse_args(argv)
    if args.out.exists():
        print(f"error: {args.out} exists; give a new --out", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    args.out.mkdir(parents=True)
    chars = CharTokenizer(list(ALPHABET))  # token i is ALPHABET[i]
    rows, _ = repetition_batch(4000, N_CTX, len(ALPHABET), torch.Generator().manual_seed(args.seed + 3))
    (args.out / "data.txt").write_text(chars.decode(rows.flatten().tolist()))
    write_run_json(args.out, {"command": "python -m train.repetition " + " ".join(argv or sys.argv[1:]),
                              "data": {"path": "data.txt"}, "steps": args.steps})

    def log(step: int, loss: float, held_out: float | None) -> None:
        record = {"step": step, "train_loss": loss}
        append_metrics(args.out, record if held_out is None else {**record, "repeat_loss": held_out})

    _, measured = train(args.out, steps=args.steps, every=args.every, seed=args.seed,
                        tokenizer=chars, log=log)
    print(f"{args.out}: {len(measured)} snapshots; held-out loss on the repeated part "
          + " ".join(f"{s}:{v:.2f}" for s, v in measured))
    return 0


if __name__ == "__main__":
    sys.exit(main())
