"""What a learning-rate sweep's backends buy and cost, measured side by side in one run.

    python benchmarks/bench_sweep.py                  # 4 rates x 2000 steps of transformer4_small, twice (~7 min)
    python benchmarks/bench_sweep.py --quick          # 2 rates x 100 steps, a smoke run

The same grid (`python -m train.sweep`, one `python -m train` process per rate, one torch thread
each) three ways:
1. one run after another (`--workers 1`) against two at a time (`--workers 2`).
   Goal on 2 cores: at least 1.7x faster.
2. the Ray backend (`--backend ray --workers 2`, a local Ray started and stopped by the sweep,
   inside the timing) against the local backend with 2 workers. Goal: at most 1.15x. Ray's cost
   is mostly fixed (starting and stopping a local Ray: measured alone on the last line), so the
   ratio falls as the runs grow; the default grid is a short real sweep (~26 s a run here).

Wall times of whole sweeps (driver, diagnosis and sweep.json included), medians over --repeats,
the three alternated so that drift hits each alike. Run it on a quiet machine (see `uptime`).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
DATA = REPO / "data" / "tinyshakespeare.txt"
BACKENDS = {"sequential": ["--workers", "1"], "local": ["--workers", "2"],
            "ray": ["--workers", "2", "--backend", "ray"]}


def sweep_seconds(grid: list[str], extra: list[str]) -> float:
    from train.sweep.cli import main

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        rc = main([*grid, "--out", f"{tmp}/sweep", *extra])
        seconds = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"the sweep {' '.join(extra)} exited {rc}")
    return seconds


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="transformer4_small", help="model preset (default transformer4_small)")
    p.add_argument("--lr", default="1e-3,3e-3,1e-2,3e-2",
                   help="rates swept, all stable so every run is as long (default 1e-3,3e-3,1e-2,3e-2)")
    p.add_argument("--steps", type=int, default=2000, help="steps per run (default 2000)")
    p.add_argument("--batch-size", type=int, default=32, help="windows per step (default 32)")
    p.add_argument("--repeats", type=int, default=2, help="sweeps per backend, median reported (default 2)")
    p.add_argument("--quick", action="store_true", help="2 rates x 100 steps: a smoke run")
    p.add_argument("--skip-ray", action="store_true", help="leave the Ray backend out (Ray not installed)")
    args = p.parse_args(argv)
    if args.quick:
        args.lr, args.steps = "1e-3,1e-2", 100
    grid = ["--preset", args.preset, "--data", str(DATA), "--lr", args.lr, "--steps", str(args.steps),
            "--batch-size", str(args.batch_size), "--eval-every", "100", "--save-every", "0", "-q"]
    logging.basicConfig(level=logging.WARNING)  # the sweeps' progress lines stay quiet
    load = os.getloadavg()[0]
    names = [n for n in BACKENDS if not (args.skip_ray and n == "ray")]
    times: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(args.repeats):
        for name in names:
            times[name].append(sweep_seconds(grid, BACKENDS[name]))
    t = {n: statistics.median(v) for n, v in times.items()}
    runs = len(args.lr.split(","))
    print(f"== python -m train.sweep --preset {args.preset}: {runs} runs x {args.steps} steps, batch "
          f"{args.batch_size}, {os.cpu_count()} cores, load average at the start {load:.2f}")
    for name in names:
        print(f"{name + ' (' + ' '.join(BACKENDS[name]) + ')':42} {t[name]:8.1f} s")
    print(f"sequential / local, 2 workers             {t['sequential'] / t['local']:8.2f}x   (goal >= 1.7)")
    if "ray" in t:
        print(f"ray / local, 2 workers each               {t['ray'] / t['local']:8.2f}x   (goal <= 1.15)")
        print(f"ray - local                               {t['ray'] - t['local']:8.1f} s; a local Ray's start + "
              f"stop alone: {ray_start_stop():.1f} s")


def ray_start_stop() -> float:
    """Seconds to start a local Ray of 2 CPUs as the sweep does, run a task on each, and stop it."""
    import ray

    t0 = time.perf_counter()
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    echo = ray.remote(num_cpus=1)(lambda x: x)
    ray.get([echo.remote(i) for i in range(2)])
    ray.shutdown()
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
