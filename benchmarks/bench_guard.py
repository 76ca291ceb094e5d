"""The guard (`train.guard`) against three other ways of meeting a diverging run, on one
learning-rate sweep, side by side in one run.

    python benchmarks/bench_guard.py                # 7 rates x 3 seeds x 4 arms: 5 min on 2 idle cores, 15+ shared
    python benchmarks/bench_guard.py --dev          # the development sweep the defaults were tuned on
    python benchmarks/bench_guard.py --steps 30 --rates 1e-2,3 --seeds 0 --timing-steps 20   # a smoke run

The sweep: a 2-layer, 64-d GPT of ours (2 heads of 32, LayerNorm, GELU, no QK-norm) on Tiny
Shakespeare's characters, batch 16 x 64, AdamW (betas 0.9, 0.99, weight decay 0.1), a tenth of
the steps of linear warmup then cosine down to a tenth, at 7 peak rates over three decades
(3e-3 ... 3) and 3 seeds, in four arms (benchmarks/guard_arms.py): none, PaLM's rewind made
automatic, OLMo-core's skip-step rule, the guard at its defaults. Per arm it prints:

- the rescue rate: of the runs that diverged without a guard (the train loss went non-finite or
  rose a nat above its lowest so far), how many ended within 0.05 and within 0.5 nats of the best
  unguarded run of the same seed (final val loss on 64 fixed held-out windows);
- Wortsman et al.'s LR sensitivity of the sweep (`probes.sweep_stats.lr_sensitivity`: a run that
  ended non-finite counts as its initial loss), the mean over the seeds;
- healthy runs changed: runs that did not diverge without a guard but ended elsewhere with it;
- steps recomputed (updates undone by rewinds) and batches skipped (never learned from);
- snapshot memory (the largest of any run), against the model and optimizer state it copies.

Then the guard's cost on a healthy run (the best-behaved rate, 1e-2): the bare loop against the
same loop with the guard at its defaults, in adjacent pairs after one untimed run of each,
medians of wall-clock and CPU time (goal <= 1.05x); the two runs' final weights are compared
bitwise (a healthy run is untouched). --dev runs seeds 100 and 101 at 1e-2, 0.3, 1 and 3 for each
--try setting (KEY=VALUE,...; repeatable), the sweep the defaults were chosen on.
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from guard_arms import ARMS, Outcome, ids, train  # noqa: E402

RATES = (3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0, 3.0)
SEEDS = (0, 1, 2)
DEV_RATES, DEV_SEEDS = (1e-2, 3e-1, 1.0, 3.0), (100, 101)
GOAL = 1.05
NEAR = (0.05, 0.5)  # nats from the best unguarded run of the seed that count as rescued


def sweep(arms: tuple[str, ...], rates: tuple[float, ...], seeds: tuple[int, ...], steps: int, workers: int,
          guard_options: dict | None = None) -> list[Outcome]:
    ids()  # read once, before the workers fork
    import train.guard.run  # noqa: F401 (imported before the fork: every run of the sweep runs the same code)
    jobs = [(arm, lr, seed, steps, guard_options if arm in ("guard", "palm") else None)
            for seed in seeds for lr in rates for arm in arms]
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("fork")) as pool:
        return list(pool.map(_one, jobs))


def _one(job: tuple) -> Outcome:
    logging.getLogger("train.guard").setLevel(logging.ERROR)  # one line per rescue: counted here instead
    return train(*job)


def table(runs: list[Outcome], arms: tuple[str, ...]) -> list[str]:
    """One line per arm: rescue rates, LR sensitivity, healthy runs changed, steps, memory."""
    from probes.sweep_stats import lr_sensitivity

    bare = {(r.lr, r.seed): r for r in runs if r.arm == "none"}
    best = {seed: min((r.final_val for r in bare.values() if r.seed == seed and math.isfinite(r.final_val)),
                      default=math.nan) for seed in {r.seed for r in runs}}
    diverged = {k for k, r in bare.items() if r.rose}
    lines = [f"{'arm':<6} {'rescued <=0.05':>15} {'rescued <=0.5':>14} {'LR sensitivity':>15} {'healthy changed':>16} "
             f"{'rescues':>8} {'recomputed':>11} {'skipped':>8} {'stops':>6} {'snapshot MiB':>13}"]
    for arm in arms:
        mine = {(r.lr, r.seed): r for r in runs if r.arm == arm}
        near = [sum(1 for k in diverged if mine[k].final_val - best[k[1]] <= d) for d in NEAR]
        by_seed = {}
        for (lr, seed), r in sorted(mine.items()):
            by_seed.setdefault(seed, ([], []))
            by_seed[seed][0].append(r.final_val if math.isfinite(r.final_val) else None)
            by_seed[seed][1].append(r.init_val)
        sens = [s for losses, inits in by_seed.values() if (s := lr_sensitivity(losses, inits)) is not None]
        changed = sum(1 for k, r in mine.items() if k not in diverged and r.final_val != bare[k].final_val)
        healthy = len(mine) - len(diverged)
        lines.append(f"{arm:<6} {near[0]:>9}/{len(diverged):<5} {near[1]:>8}/{len(diverged):<5} "
                     f"{statistics.fmean(sens) if sens else math.nan:>15.3f} {changed:>10}/{healthy:<5} "
                     f"{sum(r.rescues for r in mine.values()):>8} {sum(r.recomputed for r in mine.values()):>11} "
                     f"{sum(r.skipped for r in mine.values()):>8} {sum(r.stopped for r in mine.values()):>6} "
                     f"{max(r.snapshot_bytes for r in mine.values()) / 2**20:>13.2f}")
    state = max(r.state_bytes for r in runs) / 2**20
    lines.append(f"(model + optimizer state: {state:.2f} MiB; runs that diverged without a guard: "
                 f"{len(diverged)} of {len(bare)}; best unguarded final val loss per seed: "
                 + ", ".join(f"{s}: {v:.3f}" for s, v in sorted(best.items())) + ")")
    return lines


def per_run(runs: list[Outcome], arms: tuple[str, ...]) -> list[str]:
    """Final val loss of every (rate, seed) per arm, the ones that diverged unguarded marked *."""
    bare = {(r.lr, r.seed): r for r in runs if r.arm == "none"}
    got = {(r.arm, r.lr, r.seed): r for r in runs}
    lines = [f"{'rate':>6} {'seed':>4}  " + "  ".join(f"{a:>12}" for a in arms)]
    for (lr, seed), b in sorted(bare.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        cells = []
        for a in arms:
            r = got[(a, lr, seed)]
            note = f"({r.rescues}{'!' if r.stopped else ''})" if a != "none" and r.rescues else ""
            cells.append(f"{r.final_val:7.3f}{note:>5}")
        lines.append(f"{lr:>6g} {seed:>4}{'*' if b.rose else ' '} " + "  ".join(f"{c:>12}" for c in cells))
    return lines


def timing(steps: int, repeats: int) -> list[str]:
    """The bare loop against the guarded one on a healthy run, pairs alternating; the weights compared."""
    results: dict[str, list[tuple[float, float]]] = {"none": [], "guard": []}
    finals = {}
    order = ["none", "guard"] + [a for i in range(repeats) for a in (("none", "guard") if i % 2 == 0 else ("guard", "none"))]
    for i, arm in enumerate(order):
        t0, c0 = time.perf_counter(), time.process_time()
        out = train(arm, 1e-2, 0, steps, keep_weights=True)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if i >= 2:  # the first of each is untimed
            results[arm].append((wall, cpu))
        finals[arm] = out.weights
    same = all(finals["none"][k].equal(finals["guard"][k]) for k in finals["none"])
    wall = statistics.median(g[0] for g in results["guard"]) / statistics.median(b[0] for b in results["none"])
    cpu = statistics.median(g[1] for g in results["guard"]) / statistics.median(b[1] for b in results["none"])
    verdict = "meets" if min(wall, cpu) <= GOAL else "misses"
    return [f"a healthy run (rate 1e-2, {steps} steps, {repeats} runs a side): guarded / bare "
            f"wall {wall:.3f}x, CPU {cpu:.3f}x ({verdict} the goal of <= {GOAL}x)",
            f"final weights bitwise equal with and without the guard: {same}"]


def parse_try(text: str) -> dict:
    out = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        out[key] = int(value) if value.lstrip("-").isdigit() else float(value)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300, help="steps per run (default 300)")
    p.add_argument("--rates", default=",".join(f"{r:g}" for r in RATES), help="peak rates, comma-separated")
    p.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="seeds, comma-separated (default 0,1,2)")
    p.add_argument("--workers", type=int, default=2, help="runs trained at once, one thread each (default 2)")
    p.add_argument("--timing-steps", type=int, default=150, help="steps of each timed healthy run (0: no timing)")
    p.add_argument("--repeats", type=int, default=4, help="timed runs a side (default 4)")
    p.add_argument("--dev", action="store_true", help="the development sweep (seeds 100, 101), per --try setting")
    p.add_argument("--try", dest="tries", action="append", default=[], metavar="KEY=VALUE,...",
                   help="with --dev: Guard settings to try (repeatable; the defaults always run)")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    if args.dev:
        rates, seeds = DEV_RATES, DEV_SEEDS
        base = sweep(("none",), rates, seeds, args.steps, args.workers)
        for options in [{}] + [parse_try(t) for t in args.tries]:
            guarded = sweep(("guard",), rates, seeds, args.steps, args.workers, options)
            print(f"--- guard {options or 'defaults'}")
            print("\n".join(table(base + guarded, ("none", "guard"))[1:]))
            print("\n".join(per_run(base + guarded, ("none", "guard"))))
        print(f"({time.perf_counter() - t0:.0f} s)")
        return 0
    rates = tuple(float(r) for r in args.rates.split(","))
    seeds = tuple(int(s) for s in args.seeds.split(","))
    runs = sweep(ARMS, rates, seeds, args.steps, args.workers)
    print(f"LR sweep: {len(rates)} rates ({', '.join(f'{r:g}' for r in rates)}) x {len(seeds)} seeds x "
          f"{len(ARMS)} arms, {args.steps} steps each")
    print("\n".join(table(runs, ARMS)))
    print("\n".join(per_run(runs, ARMS)))
    print(f"(the sweep: {time.perf_counter() - t0:.0f} s)")
    if args.timing_steps:
        print("\n".join(timing(args.timing_steps, args.repeats)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
