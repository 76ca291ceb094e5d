"""Our hooked Transformer (nothing hooked) against a plain nanoGPT-style module of the same dims.

    python benchmarks/bench_model.py                         # tiny_shakespeare_gpt + GPT-2-small dims, eager
    python benchmarks/bench_model.py --compile               # also under torch.compile (minutes on a CPU)
    python benchmarks/bench_model.py --presets tiny_shakespeare_gpt --batches 32 --threads 1
    python benchmarks/bench_model.py --clock cpu --threads 1    # on a machine shared with others
    python benchmarks/bench_model.py --device cuda --presets gpt2_124m --gpt2-ctx 1024 --batches 8 --compile
                                                             # a GPU: tokens per second of a training step

The plain module (tests/plain_gpt.py) is nanoGPT-style: one `c_attn` Linear for q, k and v,
`scaled_dot_product_attention`, `nn.LayerNorm`, a `Sequential` MLP, no hook points, no checks.
It copies our weights (same numbers in, same logits out: checked before timing).

First, per preset, the ops each pass runs (counted, not timed: no noise), ours / plain (goal
<= 1.05x): every aten op the profiler records, and the ops that compute (a kernel launch each on a
GPU), for a forward with gradients off, with them on, and a training step's forward + backward.
Then the timings: both run in one
process, interleaved round-robin after a warm-up, so load from other processes hits both alike.
Printed: median ms per call for each, and ours / plain (goal <= 1.05x, forward and
forward+backward) and each one's tokens per second (batch * ctx / median seconds; on CUDA every
call ends with a synchronize). GPT-2 small runs at ctx 128 to keep a CPU run in minutes. Compiled rows say
why they are skipped when torch.compile cannot run here (no C++ compiler for CPU inductor).
`--clock cpu` times process CPU seconds instead of wall seconds: less noisy when other processes
share the cores (with one thread; more threads add their spin-waits).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from models import build_model, get_preset  # noqa: E402
from plain_gpt import PlainGPT, copy_weights, op_counts  # noqa: E402


def build_pair(preset: str, n_ctx: int | None):
    overrides = {"dropout": 0.0} if n_ctx is None else {"dropout": 0.0, "n_ctx": n_ctx}
    cfg = get_preset(preset, **overrides)
    torch.manual_seed(0)
    ours = build_model(cfg)
    plain = PlainGPT(cfg)
    copy_weights(ours, plain)
    return cfg, ours, plain


def step_fns(model, tokens, backward: bool):
    if not backward:
        def forward():
            with torch.no_grad():
                model(tokens)
        return forward
    params = [p for p in model.parameters() if p.requires_grad]

    def forward_backward():
        logits = model(tokens)
        F.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
        for p in params:
            p.grad = None
    return forward_backward


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def time_round_robin(fns: dict, budget_s: float, repeats: int, clock=time.perf_counter,
                     sync=lambda: None) -> dict[str, float]:
    """Median seconds per call, the variants interleaved; rounds 0 and 1 warm up (and compile: a
    first backward's allocations still slowed the second round of GPT-2 small), then at least
    3 timed rounds. `sync()` runs before each clock read (CUDA: wait for the queued kernels)."""
    warm = 2
    times: dict[str, list[float]] = {name: [] for name in fns}
    began = time.perf_counter()
    for round_ in range(repeats + warm):
        if round_ >= warm + 3 and time.perf_counter() - began > budget_s:
            break
        for name, fn in fns.items():
            sync()
            start = clock()
            fn()
            sync()
            if round_ >= warm:
                times[name].append(clock() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def compile_problem() -> str | None:
    """None when torch.compile's default backend runs here, else why not (one line)."""
    try:
        torch._dynamo.reset()
        torch.compile(lambda x: x * 2 + 1)(torch.ones(4))
    except Exception as err:  # a missing compiler surfaces as one of several error types
        return f"{type(err).__name__}: {str(err).strip().splitlines()[0][:100]}"
    return None


def check_same_function(preset: str, ours, plain, tokens: torch.Tensor) -> None:
    with torch.no_grad():
        gap = (ours(tokens) - plain(tokens)).abs().max().item()
    if gap > 1e-3:
        raise SystemExit(f"{preset}: the two models do not compute one function (max |diff| {gap:.2e})")


def op_rows(preset: str, n_ctx: int | None) -> list[str]:
    """Ours / plain in ops per pass (`plain_gpt.op_counts`): a forward with gradients off, with
    them on, and a training step's forward + backward."""
    cfg, ours, plain = build_pair(preset, n_ctx)
    tokens = torch.randint(0, cfg.d_vocab, (1, cfg.n_ctx))
    rows = []
    for what, grad, backward in (("forward", False, False), ("fwd, grad", True, False), ("fwd+bwd", True, True)):
        mine, theirs = (op_counts(m.train(grad), tokens, grad, backward) for m in (ours, plain))
        rows.append(f"{preset:<22}{what:<11}" + "".join(f"{mine[k]:>8}{theirs[k]:>8}{mine[k] / theirs[k]:>8.3f}x"
                                                        for k in ("profiler", "kernels")))
    return rows


def bench(preset: str, n_ctx: int | None, batch: int, compiled: bool, args) -> None:
    cfg, ours, plain = build_pair(preset, n_ctx)
    device = torch.device(args.device)
    ours, plain = ours.to(device), plain.to(device)
    tokens = torch.randint(0, cfg.d_vocab, (batch, cfg.n_ctx)).to(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    check_same_function(preset, ours, plain, tokens)
    mode = "compiled" if compiled else "eager"
    if compiled:
        torch._dynamo.reset()  # fresh caches per model pair: no recompile limits across rows
        eager = ours
        ours, plain = torch.compile(ours), torch.compile(plain)
        check_same_function(preset, ours, eager, tokens)  # also compiles the forward
    for backward in (False, True):
        fns = {"ours": step_fns(ours, tokens, backward), "plain": step_fns(plain, tokens, backward)}
        t = time_round_robin(fns, args.budget_s, args.repeats, CLOCKS[args.clock], sync)
        what = "fwd+bwd" if backward else "forward"
        per_s = {name: batch * cfg.n_ctx / seconds for name, seconds in t.items()}  # tokens per second
        print(f"{preset:<22}{cfg.n_ctx:>5}{batch:>6}  {mode:<9}{what:<8}{t['ours'] * 1e3:>10.2f}"
              f"{t['plain'] * 1e3:>10.2f}{t['ours'] / t['plain']:>8.3f}x{per_s['ours']:>12.0f}"
              f"{per_s['plain']:>12.0f}", flush=True)



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["tiny_shakespeare_gpt", "gpt2_124m"],
                        help="presets to compare (default tiny_shakespeare_gpt gpt2_124m)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32], help="batch sizes (default 1 32)")
    parser.add_argument("--gpt2-ctx", type=int, default=128, help="context for gpt2_124m (default 128)")
    parser.add_argument("--compile", action="store_true", help="also time both under torch.compile")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall seconds, or process CPU seconds on a shared machine (default wall)")
    parser.add_argument("--repeats", type=int, default=30, help="most timed rounds (default 30)")
    parser.add_argument("--budget-s", type=float, default=20.0, help="stop a comparison after this "
                        "many seconds, at least 3 rounds (default 20)")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: this torch sees no CUDA device")
    torch.set_num_threads(args.threads)
    no_compile = compile_problem() if args.compile else None
    print("ops per pass, ours (nothing hooked) vs plain (goal <= 1.05x): every aten op the profiler records, "
          "and the ops that compute (a kernel launch each on a GPU)")
    print(f"{'preset':<22}{'pass':<11}{'profiler: ours':>16}{'plain':>8}{'ratio':>9}{'kernels: ours':>16}{'plain':>8}{'ratio':>9}")
    for preset in args.presets:
        for line in op_rows(preset, args.gpt2_ctx if preset.startswith("gpt2") else None):
            print(line, flush=True)
    print(f"device={args.device}, threads={args.threads}, {args.clock} clock; median ms per call, ours "
          "(nothing hooked) vs plain nanoGPT-style, and tokens per second")
    if no_compile:
        print(f"torch.compile unavailable here, compiled rows skipped ({no_compile})")
    print(f"{'preset':<22}{'ctx':>5}{'batch':>6}  {'mode':<9}{'pass':<8}{'ours':>10}{'plain':>10}{'ratio':>9}"
          f"{'ours tok/s':>12}{'plain tok/s':>12}")
    for preset in args.presets:
        n_ctx = args.gpt2_ctx if preset.startswith("gpt2") else None
        for batch in args.batches:
            for compiled in (False, True) if args.compile and not no_compile else (False,):
                bench(preset, n_ctx, batch, compiled, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
