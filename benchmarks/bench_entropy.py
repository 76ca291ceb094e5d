"""Entropy probe vs a plain forward pass vs caching every pattern, side by side in one run.

    python benchmarks/bench_entropy.py                      # the issue's table: tiny_shakespeare_gpt at
                                                            # ctx 128 x 64, 512 x 16, 2048 x 2 windows,
                                                            # and the memory of one GPT-2-small layer at 8192
    python benchmarks/bench_entropy.py --threads 1 --clock cpu  # steadier on a busy shared machine
    python benchmarks/bench_entropy.py --n-ctx 512 --batch 16   # one context, every variant

    python benchmarks/bench_entropy.py --preset gpt2_124m --n-layers 1 --n-ctx 8192 --batch 1 \
        --variants forward probe                            # memory of one GPT-2-small layer at 8192

Same model, seed and tokens everywhere. Time: one process calls the variants round-robin
(one warm-up round, then up to --repeats rounds within --budget-s) so that load from other processes hits all of them
alike; median and min per call. Peak memory: each variant once in its own fresh process, on CPU
the growth of the max RSS over what the process held before the call, on CUDA
`torch.cuda.max_memory_allocated` over the allocation before it.

  forward  model(tokens) under inference_mode: the fused (SDPA) attention path
  explicit the same with attention forced onto its explicit path (scores, softmax, pattern) and
           no hooks: what any pattern probe pays before it reduces anything
  probe    probes.entropy.run(model, tokens): what "auto" takes: from 129 tokens on our models the
           q/k route (`probes.rows.qk`: each layer's own fused call takes v' = [k | v] and
           so also gives the rows' logsumexp and sum p k), the pattern route below; the
           forward pass stops inside the last layer's attention
  blockwise the q/k route without the fused kernel (the blockwise reduction it falls back to)
  pattern  the same probe on route="pattern": explicit attention path + reduction of hook_pattern
  cache    run_with_cache(every hook_pattern), then entropy and normalised entropy from the cache
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("forward", "explicit", "probe", "blockwise", "pattern", "cache")
SUITE = ((128, 64), (512, 16), (2048, 2))  # (context, windows): the contexts
SUITE_VARIANTS = ["forward", "probe", "pattern"]
MEMORY_CTX = 8192  # one GPT-2-small layer, forward vs probe: peak memory only
GOAL = 1.2  # probe / forward time, the median of the rounds' paired ratios


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny_shakespeare_gpt", help="model preset (default tiny_shakespeare_gpt)")
    parser.add_argument("--n-ctx", type=int,
                        help="one context length (default: the suite " + ", ".join(f"{n} x {b}" for n, b in SUITE)
                        + f", then the memory at {MEMORY_CTX})")
    parser.add_argument("--batch", type=int, default=64, help="windows per forward pass with --n-ctx (default 64)")
    parser.add_argument("--repeats", type=int, default=15, help="most timed rounds of all variants (default 15)")
    parser.add_argument("--budget-s", type=float, default=45.0,
                        help="stop timing after the round that passes this many seconds, at least 3 rounds "
                             "(default 45, keeps the whole script under 2 minutes on 2 busy cores)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall-clock time, or this process' CPU time (steadier when other jobs share "
                             "the cores; use with --threads 1, as idle threads spin)")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS,
                        help="which variants to run (default all with --n-ctx, else " + " ".join(SUITE_VARIANTS)
                        + "; forward and probe are needed for the ratios)")
    parser.add_argument("--n-layers", type=int, help="override the preset's layer count")
    parser.add_argument("--worker", choices=VARIANTS + ("timing",), help=argparse.SUPPRESS)
    return parser


def max_rss_bytes() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024  # Linux reports KiB


def variant_fn(name: str, model, tokens):
    import torch

    from probes import entropy
    if name in ("forward", "explicit"):
        def fn():
            model.set_attn_impl("explicit" if name == "explicit" else "auto")
            try:
                with torch.inference_mode():
                    model(tokens)
            finally:
                model.set_attn_impl("auto")
    elif name in ("probe", "pattern"):
        route = "auto" if name == "probe" else "pattern"

        def fn():
            entropy.run(model, tokens, batch_size=tokens.shape[0], progress=False, route=route)
    elif name == "blockwise":
        from models import attention
        from probes.rows import qk

        def fn():
            kernel = qk.FLASH_CPU
            qk.FLASH_CPU = attention.FLASH_CPU = None  # as on a torch without the op
            try:
                entropy.run(model, tokens, batch_size=tokens.shape[0], progress=False, route="qk")
            finally:
                qk.FLASH_CPU = attention.FLASH_CPU = kernel
    else:
        names = [f"blocks.{l}.attn.hook_pattern" for l in range(model.cfg.n_layers)]

        def fn():
            with torch.inference_mode():
                _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
                for n in names:
                    entropy.series_entropy(cache[n]).tolist()
                    entropy.normalized_entropy(cache[n]).mean(dim=(0, 2)).tolist()
    return fn


def setup(args: argparse.Namespace):
    """The model and tokens every variant sees (same seed in every process)."""
    sys.path.insert(0, str(REPO))
    import torch

    from models import build_model, get_preset
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    overrides = {"n_layers": args.n_layers} if args.n_layers else {}
    cfg = get_preset(args.preset, n_ctx=args.n_ctx, dropout=0.0, **overrides)
    model = build_model(cfg).to(device).eval()
    tokens = torch.randint(0, cfg.d_vocab, (args.batch, cfg.n_ctx), device=device)
    return torch, device, model, tokens


def memory_worker(args: argparse.Namespace) -> dict:
    """Peak memory of one call of one variant, in this fresh process."""
    torch, device, model, tokens = setup(args)
    fn = variant_fn(args.worker, model, tokens)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return {"peak_bytes": torch.cuda.max_memory_allocated() - base}
    base = max_rss_bytes()
    fn()
    return {"peak_bytes": max_rss_bytes() - base}


def round_robin(fns: dict, repeats: int, budget_s: float, clock: str, sync=lambda: None) -> dict[str, dict]:
    """Seconds per call of each of `fns` (then `sync()`), called round-robin so load drifts hit all
    alike: one warm-up round, then up to `repeats` rounds (at least 3) within `budget_s`; `clock`
    "cpu" (this process' CPU time) or wall-clock. {name: {median_s, min_s, rounds}}."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    tick = time.process_time if clock == "cpu" else time.perf_counter
    began = time.perf_counter()
    for round_ in range(repeats + 1):  # round 0 is the warm-up
        if round_ > 3 and time.perf_counter() - began > budget_s:
            break
        for name, fn in fns.items():
            start = tick()
            fn()
            sync()
            if round_:
                times[name].append(tick() - start)
    return {name: {"median_s": statistics.median(t), "min_s": min(t), "rounds": len(t), "times": t}
            for name, t in times.items()}


def timing_worker(args: argparse.Namespace) -> dict:
    """Seconds per call of every variant, interleaved round-robin (`round_robin`)."""
    torch, device, model, tokens = setup(args)
    fns = {name: variant_fn(name, model, tokens) for name in args.variants}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    return round_robin(fns, args.repeats, args.budget_s, args.clock, sync)


def worker_argv(args: argparse.Namespace, worker: str) -> list[str]:
    return [sys.executable, __file__, "--worker", worker, "--preset", args.preset, "--n-ctx", str(args.n_ctx),
            "--batch", str(args.batch), "--repeats", str(args.repeats), "--device", args.device,
            "--threads", str(args.threads), "--budget-s", str(args.budget_s), "--clock", args.clock,
            "--variants", *args.variants] + (["--n-layers", str(args.n_layers)] if args.n_layers else [])


def collect(proc: subprocess.Popen, worker: str) -> dict:
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{worker} worker failed:\n{err}")
    return json.loads(out.strip().splitlines()[-1])


def spawn(args: argparse.Namespace, worker: str, memory: bool = False) -> subprocess.Popen:
    # glibc: a fixed mmap threshold returns every large tensor to the OS when it is freed, so the
    # max RSS follows the live tensors instead of whatever the allocator kept cached (timing runs
    # with the default allocator: unmapping every temporary would slow it down)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"} if memory else None
    return subprocess.Popen(worker_argv(args, worker), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def peak_memory(args: argparse.Namespace) -> dict[str, dict]:
    """Each variant once in its own fresh process, side by side (peak memory is per process, so
    running them at once changes nothing but the wall-clock time of this script)."""
    procs = {name: spawn(args, name, memory=True) for name in args.variants}
    return {name: collect(proc, name) for name, proc in procs.items()}


def measure(args: argparse.Namespace) -> dict[str, dict]:
    """Timing in one process, then the memory workers."""
    rows = collect(spawn(args, "timing"), "timing")
    for name, row in peak_memory(args).items():
        rows[name].update(row)
    return rows


def ratio(rows: dict[str, dict], a: str, b: str, key: str) -> float:
    return rows[a][key] / max(rows[b][key], 1e-12)


def paired_ratios(rows: dict[str, dict], a: str, b: str) -> tuple[float, float, float]:
    """(median, lower quartile, upper quartile) of a / b within each round: the two calls of a
    round run back to back, so a load drift between rounds cancels instead of widening the ratio."""
    each = sorted(x / max(y, 1e-12) for x, y in zip(rows[a]["times"], rows[b]["times"]))
    if len(each) < 4:
        return statistics.median(each), each[0], each[-1]
    low, _, high = statistics.quantiles(each, n=4)
    return statistics.median(each), low, high


def report(args: argparse.Namespace, rows: dict[str, dict]) -> None:
    print(f"{args.preset} n_ctx={args.n_ctx} batch={args.batch} device={args.device} threads={args.threads} "
          f"clock={args.clock}; timed rounds: {next(iter(rows.values()))['rounds']} after one warm-up, "
          "variants interleaved")
    print(f"{'variant':<10}{'median ms':>12}{'min ms':>10}{'peak MiB':>12}")
    for name, row in rows.items():
        print(f"{name:<10}{row['median_s'] * 1e3:>12.1f}{row['min_s'] * 1e3:>10.1f}"
              f"{row['peak_bytes'] / 2**20:>12.1f}")
    if "probe" in rows and "forward" in rows:
        median, low, high = paired_ratios(rows, "probe", "forward")
        print(f"{'probe / forward per round:':<27}{median:.2f}x median, quartiles {low:.2f}-{high:.2f}x "
              f"(goal <= {GOAL}x)")
    for a, b, why in (("probe", "forward", ""), ("explicit", "forward", "the explicit path alone"),
                      ("blockwise", "forward", "q/k without the fused kernel"),
                      ("pattern", "forward", "the route before q/k"), ("probe", "pattern", ""),
                      ("cache", "forward", "")):
        if a in rows and b in rows:
            print(f"{a + ' / ' + b + ' time:':<27}{ratio(rows, a, b, 'median_s'):.2f}x median, "
                  f"{ratio(rows, a, b, 'min_s'):.2f}x min" + (f" ({why})" if why else ""))
    for a, b in (("probe", "cache"), ("probe", "pattern"), ("probe", "forward")):
        if a in rows and b in rows:
            print(f"{a + ' / ' + b + ' memory:':<27}{ratio(rows, a, b, 'peak_bytes'):.2f}x")


def suite(args: argparse.Namespace) -> None:
    """The issue's table: probe / forward at each SUITE context, then the memory at MEMORY_CTX."""
    variants = args.variants or SUITE_VARIANTS
    summary = []
    for n_ctx, batch in SUITE:
        one = argparse.Namespace(**{**vars(args), "n_ctx": n_ctx, "batch": batch, "variants": variants})
        rows = measure(one)
        report(one, rows)
        print()
        summary.append((n_ctx, batch, *paired_ratios(rows, "probe", "forward")))
    big = argparse.Namespace(**{**vars(args), "preset": "gpt2_124m", "n_layers": 1, "n_ctx": MEMORY_CTX,
                                "batch": 1, "variants": ["forward", "probe"]})
    mem = peak_memory(big)
    print(f"{'context':>8}{'windows':>9}   probe / forward time per round (goal <= {GOAL}x)")
    for n_ctx, batch, median, low, high in summary:
        print(f"{n_ctx:>8}{batch:>9}   {median:.2f}x median, quartiles {low:.2f}-{high:.2f}x"
              + ("" if median <= GOAL else "   (goal not met)"))
    fwd, probe = (mem[name]["peak_bytes"] / 2**20 for name in ("forward", "probe"))
    print(f"{MEMORY_CTX} tokens, one GPT-2-small layer, 1 window: peak memory forward +{fwd:.0f} MiB, "
          f"probe +{probe:.0f} MiB (goal: a few hundred MB)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker:
        result = timing_worker(args) if args.worker == "timing" else memory_worker(args)
        print(json.dumps(result))
        return 0
    if args.n_ctx is None:
        suite(args)
        return 0
    args.variants = args.variants or list(VARIANTS)
    report(args, measure(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
