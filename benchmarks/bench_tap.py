"""The entropy probe through the attention tap vs a plain forward pass, on a tutorial GPT, in one run.

    python benchmarks/bench_tap.py                               # SDPA tutorial GPT, context 512, 4 windows
    python benchmarks/bench_tap.py --threads 1 --clock cpu       # steadier on a busy shared machine
    python benchmarks/bench_tap.py --model batched               # the explicit-softmax tutorial GPT

The model is a tutorial GPT from `tests/gpt_kit/tutorial.py` (Karpathy's video sizes: 6 layers,
6 heads, d_model 384) at `--n-ctx`: `sdpa` calls `F.scaled_dot_product_attention(is_causal=True)`
(the tap rebuilds each layer's pattern from the call and checks `pattern @ v` against its output),
`batched` takes a softmax over [batch head q k], `perhead` one module per head. One process calls
the variants round-robin (one warm-up round, then up to --repeats rounds within --budget-s) so that
load from other processes hits all of them alike; median and min per call.

  forward  model(tokens) under inference_mode
  tap      models.tap.tap_forward(model, tokens) with a reducer that keeps nothing: the tap's cost
  probe    probes.entropy.run(model, tokens): the tap plus the entropy reduction (goal <= 1.5x forward)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODELS = ("sdpa", "batched", "perhead")
GOAL = 1.5


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=MODELS, default="sdpa", help="which tutorial GPT (default sdpa)")
    parser.add_argument("--n-ctx", type=int, default=512, help="context length (default 512)")
    parser.add_argument("--batch", type=int, default=4, help="windows per forward pass (default 4)")
    parser.add_argument("--n-layers", type=int, default=6, help="layers (default 6)")
    parser.add_argument("--n-heads", type=int, default=6, help="heads (default 6)")
    parser.add_argument("--d-model", type=int, default=384, help="width (default 384)")
    parser.add_argument("--repeats", type=int, default=7, help="most timed rounds (default 7)")
    parser.add_argument("--budget-s", type=float, default=60.0,
                        help="stop timing after the round that passes this many seconds, at least 3 rounds (default 60)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall-clock time, or this process' CPU time (steadier when other jobs share the "
                             "cores; use with --threads 1, as idle threads spin)")
    return parser


def setup(args: argparse.Namespace):
    """The model and tokens every variant sees."""
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "tests"))
    import torch

    from gpt_kit import BatchedGPT, PerHeadGPT, SdpaGPT
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cls = {"sdpa": SdpaGPT, "batched": BatchedGPT, "perhead": PerHeadGPT}[args.model]
    model = cls(n_layers=args.n_layers, n_heads=args.n_heads, d=args.d_model, ctx=args.n_ctx, vocab=65).eval()
    tokens = torch.randint(0, 65, (args.batch, args.n_ctx))
    return torch, model, tokens


def variants(torch, model, tokens) -> dict:
    from models.tap import tap_forward
    from probes import entropy

    def forward():
        with torch.inference_mode():
            model(tokens)

    return {"forward": forward,
            "tap": lambda: tap_forward(model, tokens, lambda call: None),
            "probe": lambda: entropy.run(model, tokens, batch_size=tokens.shape[0], progress=False)}


def measure(args: argparse.Namespace) -> dict[str, dict]:
    torch, model, tokens = setup(args)
    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_entropy import round_robin
    return round_robin(variants(torch, model, tokens), args.repeats, args.budget_s, args.clock)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rows = measure(args)
    print(f"{args.model} tutorial GPT: {args.n_layers} layers x {args.n_heads} heads, d_model {args.d_model}, "
          f"{args.batch} windows of {args.n_ctx} tokens, {args.threads} thread(s), {args.clock} clock")
    print(f"{'variant':>8}{'median ms':>11}{'min ms':>9}{'rounds':>8}")
    for name, row in rows.items():
        print(f"{name:>8}{row['median_s'] * 1e3:>11.1f}{row['min_s'] * 1e3:>9.1f}{row['rounds']:>8}")
    for name in ("tap", "probe"):
        median = rows[name]["median_s"] / rows["forward"]["median_s"]
        least = rows[name]["min_s"] / rows["forward"]["min_s"]
        goal = f"   (goal <= {GOAL}x{'' if median <= GOAL else ': not met'})" if name == "probe" else ""
        print(f"{name} / forward: {median:.2f}x median, {least:.2f}x min{goal}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
