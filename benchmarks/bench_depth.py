"""Head types and direct logit attribution against one forward pass on the same input, in one run.

    python benchmarks/bench_depth.py                      # the issue's table (goal: ratios <= 1.5)
    python benchmarks/bench_depth.py --threads 1          # steadier on a busy shared machine

Rows:
  heads, shakespeare_gpt  probes.heads.run (all four detect_head types, all heads, copying off)
                          on --batch random sequences of half its context repeated twice, vs
                          model(tokens) under no_grad on those tokens
  heads, gpt2-small-sized the same on a random GPT-2-small-sized model (12 layers, 12 heads,
                          d 768; vocabulary 50257; context --gpt2-ctx)
  attribution             probes.attribution.run at the last position of one window of n_ctx
                          tokens, vs model(tokens) on that window, for both models

  tuned lens              then, from benchmarks/bench_tuned_lens.py, one training epoch of the
                          shipped GPT's tuned lens against a logit-lens pass (--no-tuned skips it)

Timing: the variants of a row are called round-robin (one warm-up round, then --repeats rounds)
so that load from other processes hits both alike; the ratio is of the medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def timed_pair(a, b, repeats: int) -> tuple[float, float]:
    a(), b()  # warm-up
    ta, tb = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a()
        ta.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        b()
        tb.append(time.perf_counter() - t0)
    return statistics.median(ta), statistics.median(tb)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16, help="random repeated sequences for head types")
    parser.add_argument("--gpt2-batch", type=int, default=2, help="sequences for the GPT-2-sized model")
    parser.add_argument("--gpt2-ctx", type=int, default=256, help="context of the GPT-2-sized model")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per row")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--no-tuned", action="store_true", help="skip the tuned-lens epoch at the end")
    args = parser.parse_args(argv)

    import torch

    from models import build_model, get_preset
    from models.checkpoint import load_checkpoint
    from probes import attribution, heads

    if args.threads:
        torch.set_num_threads(args.threads)
    gpt = load_checkpoint(Path(__file__).resolve().parent.parent / "checkpoints" / "shakespeare_gpt").model.eval()
    torch.manual_seed(0)
    big = build_model(get_preset("gpt2_124m", n_ctx=args.gpt2_ctx)).eval()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {args.repeats} rounds, median seconds")
    print(f"{'row':<34}{'probe':>10}{'forward':>10}{'ratio':>8}")
    for label, model, batch in [("shakespeare_gpt", gpt, args.batch), ("gpt2-small-sized", big, args.gpt2_batch)]:
        n_ctx, d_vocab = int(model.cfg.n_ctx), int(model.cfg.d_vocab)
        tokens = heads.random_repeat_tokens(d_vocab, n_ctx // 2, batch, seed=0)  # [batch n_ctx]

        def forward(model=model, tokens=tokens):
            with torch.no_grad():
                model(tokens)

        def probe(model=model, tokens=tokens, batch=batch):
            heads.run(model, tokens, repeat_period=n_ctx // 2, copying=False, batch_size=batch)

        p, f = timed_pair(probe, forward, args.repeats)
        print(f"{'heads, ' + label + f' ({batch}x{n_ctx})':<34}{p:>10.4f}{f:>10.4f}{p / f:>8.2f}")
        window = tokens[:1]  # [1 n_ctx]

        def forward_one(model=model, window=window):
            with torch.no_grad():
                model(window)

        def attribute(model=model, window=window):
            attribution.run(model, window, position=-1)

        p, f = timed_pair(attribute, forward_one, args.repeats)
        print(f"{'attribution, ' + label + f' (1x{n_ctx})':<34}{p:>10.4f}{f:>10.4f}{p / f:>8.2f}")
    print("goal: every ratio at most 1.5")
    if not args.no_tuned:  # the tuned lens's epoch time, in the same run (benchmarks/bench_tuned_lens.py)
        from bench_tuned_lens import main as tuned_lens_epoch

        print("\n== a tuned-lens epoch against a logit-lens pass")
        tuned_lens_epoch(["--repeats", "3"] + (["--threads", str(args.threads)] if args.threads else []))
    return 0


if __name__ == "__main__":
    sys.exit(main())
