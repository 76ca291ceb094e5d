"""Loading a GPT-2-124M-sized nanoGPT checkpoint, against `torch.load` of the same file alone.

    python benchmarks/bench_load.py                    # 5 rounds, model weights only
    python benchmarks/bench_load.py --with-optimizer   # + AdamW moments, as nanoGPT saves them
    python benchmarks/bench_load.py --repeats 2        # a smoke run

The file is written as nanoGPT's train.py writes it (random weights of GPT-2 124M's shapes:
12 layers, 12 heads, n_embd 768, block_size 1024, vocab 50304, bias, tied lm_head). Each round
times `torch.load(path, weights_only=True)` and `load_checkpoint(path)` (read, check, build,
load, eval mode) one after the other, so drift hits both alike; medians are printed with their
ratio. Goal: load_checkpoint at most 1.5x torch.load. The page cache is warm for both (the file
was just written and is read every round).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from models.checkpoint import load_checkpoint  # noqa: E402
from models.store.gpt2_layout import GPT2Dims, expected_shapes  # noqa: E402

GPT2_124M = GPT2Dims(n_layer=12, n_head=12, n_embd=768, n_ctx=1024, vocab_size=50304, d_mlp=3072, bias=True)


def write_checkpoint(path: Path, with_optimizer: bool) -> int:
    """nanoGPT's checkpoint dict with 124M random weights; returns the parameter count."""
    state = {name: torch.randn(shape) * 0.02 for name, shape in
             expected_shapes(GPT2_124M, conv1d=False, lm_head=False).items()}
    state["lm_head.weight"] = state["transformer.wte.weight"]  # tied: torch.save keeps one storage
    optimizer = {"state": {}, "param_groups": [{"lr": 6e-4, "params": list(range(len(state) - 1))}]}
    if with_optimizer:
        optimizer["state"] = {i: {"step": torch.tensor(5000.0), "exp_avg": torch.zeros_like(t),
                                  "exp_avg_sq": torch.zeros_like(t)}
                              for i, t in enumerate(v for k, v in state.items() if k != "lm_head.weight")}
    args = {"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024, "bias": True,
            "vocab_size": 50304, "dropout": 0.0}
    torch.save({"model": state, "optimizer": optimizer, "model_args": args, "iter_num": 5000,
                "best_val_loss": torch.tensor(2.85), "config": {"dataset": "openwebtext"}}, path)
    return sum(t.numel() for k, t in state.items() if k != "lm_head.weight")


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="rounds (default 5)")
    p.add_argument("--with-optimizer", action="store_true", help="save AdamW moments too (3x the file)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ckpt.pt"
        n = write_checkpoint(path, args.with_optimizer)
        print(f"nanoGPT checkpoint: {n / 1e6:.1f}M parameters, {path.stat().st_size / 2**20:.0f} MiB"
              f"{' with optimizer state' if args.with_optimizer else ''}; torch threads {torch.get_num_threads()}")
        load_checkpoint(path)  # warm-up: imports, page cache
        plain, ours = [], []
        for _ in range(args.repeats):
            plain.append(timed(lambda: torch.load(path, map_location="cpu", weights_only=True)))
            ours.append(timed(lambda: load_checkpoint(path)))
    a, b = statistics.median(plain), statistics.median(ours)
    print(f"torch.load(weights_only=True) alone : {a:7.3f} s  (median of {args.repeats})")
    print(f"load_checkpoint                     : {b:7.3f} s")
    print(f"ratio                               : {b / a:7.2f}x  (goal <= 1.5x)")


if __name__ == "__main__":
    main()
