"""The development of a run opened cold (every snapshot read from its model) against opened from the
readings cached beside each snapshot, side by side in one run.

    python benchmarks/bench_development.py                   # 50 snapshots of a mha4-sized model
    python benchmarks/bench_development.py --snapshots 20 --preset shakespeare_gpt

A run of `--snapshots` snapshots of the preset (random weights, each snapshot a new draw) is written
into a temporary directory; `probes.development.run` is timed once cold (no development.json: every
snapshot loaded and read, then cached) and `--repeats` times from the caches (median and min). The
target (issue 51): a 50-snapshot run opens in under 2 s from its caches.

    python benchmarks/bench_development.py --compare-threads --snapshots 1000   # issue 60

With --compare-threads, the cold read instead, side by side on two copies of the run at torch's own
thread count (as the CLI runs): a tiny model read on one thread (`probes.common.one_thread_if_tiny`,
the probe's way) against on torch's threads. The target (issue 60): 1000 tiny snapshots read cold in
under a minute on a 2-core machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def make_run(run_dir: Path, preset: str, snapshots: int) -> None:
    import torch

    from models import build_model
    from models.checkpoint import save_snapshot, snapshot_name
    from models.presets import get_preset

    cfg = get_preset(preset)
    for i in range(snapshots):
        torch.manual_seed(i)
        save_snapshot(run_dir / snapshot_name(100 * i), build_model(cfg), None, step=100 * i)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/bench_development.py", description=__doc__.split("\n")[0])
    parser.add_argument("--snapshots", type=int, default=50, help="snapshots in the run (default 50)")
    parser.add_argument("--preset", default="mha4", help="model preset (default mha4)")
    parser.add_argument("--repeats", type=int, default=5, help="cached opens timed (default 5)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1, as the app)")
    parser.add_argument("--compare-threads", action="store_true",
                        help="time the cold read of a tiny model on one thread against torch's threads")
    args = parser.parse_args(argv)
    import torch

    from probes import development

    if args.compare_threads:
        return compare_threads(args)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        make_run(run_dir, args.preset, args.snapshots)
        started = time.perf_counter()
        cold = development.run(run_dir)
        cold_s = time.perf_counter() - started
        cached = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            again = development.run(run_dir)
            cached.append(time.perf_counter() - started)
        assert {s["from"] for s in again.snapshots} == {"cache"}
        drop = lambda d: [{k: v for k, v in s.items() if k != "from"} for s in d["snapshots"]]  # noqa: E731
        assert drop(again.to_dict()) == drop(cold.to_dict()) and again.phase_changes == cold.phase_changes
    median = statistics.median(cached)
    print(f"{args.snapshots} snapshots of {args.preset}, read on {cold.source}")
    per_snapshot = 1000 * cold_s / args.snapshots
    print(f"cold (every snapshot read, then cached): {cold_s:8.2f} s  ({per_snapshot:.0f} ms a snapshot)")
    print(f"from the caches: median {median:8.3f} s, min {min(cached):.3f} s over {args.repeats}  "
          f"({cold_s / median:.0f}x faster; target < 2 s)")
    return 0


def compare_threads(args: argparse.Namespace) -> int:
    import shutil

    import torch

    from probes import common, development

    with tempfile.TemporaryDirectory() as tmp:
        make_run(Path(tmp) / "one", args.preset, args.snapshots)
        shutil.copytree(Path(tmp) / "one", Path(tmp) / "torch")
        timed = {}
        for name, tiny in (("torch", 0), ("one", common.TINY_WEIGHTS)):  # 0: no model is tiny
            common.TINY_WEIGHTS = tiny
            started = time.perf_counter()
            development.run(Path(tmp) / name, progress=False)
            timed[name] = time.perf_counter() - started
    print(f"{args.snapshots} snapshots of {args.preset}, read cold, torch's threads: {torch.get_num_threads()}")
    print(f"on torch's threads: {timed['torch']:8.2f} s  ({1000 * timed['torch'] / args.snapshots:.0f} ms a snapshot)")
    print(f"on one thread:      {timed['one']:8.2f} s  ({1000 * timed['one'] / args.snapshots:.0f} ms a snapshot)"
          f"  {timed['torch'] / timed['one']:.1f}x faster")
    return 0


if __name__ == "__main__":
    sys.exit(main())
