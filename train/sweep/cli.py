"""Learning-rate sweeps: is a recipe stable, and does a fix make it more so?

    python -m train.sweep --preset transformer4_small --data data/tinyshakespeare.txt \\
        --lr 1e-3,1e-2,1e-1,1 --vary qk_norm=none,rms --steps 300 --out sweeps/qk
    python -m train.sweep --out sweeps/qk --resume          # after Ctrl-C or a lost worker
    python -m probes.sweep --ckpt sweeps/qk                  # the table and LR sensitivities

Every grid point (rate x variant) is an ordinary run directory SWEEP_DIR/<name> trained by
`python -m train` with the common flags, diagnosed by the run doctor when it ends; SWEEP_DIR/
sweep.json (`train.sweep.book`) holds the grid, each run's losses, divergence step and verdict,
and per variant the LR sensitivity and widest stable range (Wortsman et al. 2023). Backends:
local processes (`train.sweep.local`, the default) or Ray tasks (`train.sweep.on_ray`).
"""

from __future__ import annotations

import argparse
import fcntl
import logging
import os
import shlex
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from models.cli import EXIT_INTERRUPTED, POSITIVE_INT, Parser, path_text, path_type, run_cli
from probes.sweep import range_text
from probes.sweep_parts.stats import SWEEP_FILE
from train.args import build_parser as train_parser
from train.sweep.book import Job, SweepBook, read_book
from train.sweep.grid import Grid, parse_rates, parse_vary
from train.sweep.local import run_local
from train.sweep.on_ray import STORAGE, ray_session, run_ray

log = logging.getLogger("train.sweep")

__all__ = ["EXIT_RUNS_FAILED", "build_parser", "main", "sweep"]

EXIT_RUNS_FAILED = 1  # a run failed (not diverged: its own error, see its log)
LOCK_FILE = ".sweep.lock"
EXAMPLES = """examples:
  python -m train.sweep --preset transformer4_small --data data/tinyshakespeare.txt --lr 1e-3,1e-2,1e-1,1 --vary qk_norm=none,rms --steps 300 --out sweeps/qk
  python -m train.sweep --preset tiny_shakespeare_gpt_small --data data/tinyshakespeare.txt --lr 1e-4,1e-3,1e-2 --vary z_loss=0,1e-4 --out sweeps/z --backend ray
  python -m train.sweep --out sweeps/qk --resume
"""


class SweepParser(Parser):
    """The sweep's own flags; every other flag goes to `python -m train` (checked by its parser)."""

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        parsed, rest = self.parse_known_args(args, namespace)
        common = train_parser().parse_args([*rest, "--out", "_"])  # one line on a flag train refuses
        if common.data is not None or common.preset is not None:
            self.error("write --data and --preset in full")
        parsed.train_args = rest
        for check in self.checks:
            if problem := check(parsed):
                self.error(problem)
        return parsed


def build_parser() -> SweepParser:
    p = SweepParser(prog="python -m train.sweep", epilog=EXAMPLES, allow_abbrev=False,
                    description="Train one run per learning rate and variant (the product of the --vary "
                                "axes) into SWEEP_DIR, diagnose each, and summarise the sweep in "
                                "SWEEP_DIR/sweep.json (python -m probes.sweep prints it). Any other flag is "
                                "passed to every run's python -m train (see python -m train --help).",
                    checks=[lambda a: None if a.resume or (a.lr and a.preset and a.data) else
                            "give --preset, --data and --lr (or --resume a sweep)"])
    p.add_argument("--preset", metavar="NAME", help="model preset of every run")
    p.add_argument("--data", type=path_text, metavar="FILE", help="UTF-8 text file every run trains on")
    p.add_argument("--lr", type=parse_rates, metavar="R1,R2,...",
                   help="the learning rates to sweep, separated by commas (log-spaced, e.g. 1e-4,1e-3,1e-2)")
    p.add_argument("--vary", type=parse_vary, action="append", default=[], metavar="FIELD=V1,V2",
                   help="a second axis (repeatable; the variants are the product): a train hyperparameter "
                        "(z_loss=0,1e-4 -> --z-loss) or a model field (qk_norm=none,rms -> --set qk_norm=)")
    p.add_argument("--out", type=path_type, required=True, metavar="SWEEP_DIR",
                   help="folder of the sweep: one run folder per point, logs/, sweep.json")
    p.add_argument("--workers", type=POSITIVE_INT, metavar="N",
                   help="runs trained at once, one torch thread each (default: the number of cores)")
    p.add_argument("--backend", choices=("local", "ray"), default="local",
                   help="local processes, or Ray tasks on the cluster at --ray-address / $RAY_ADDRESS "
                        "(else a local Ray)")
    p.add_argument("--ray-address", metavar="ADDR", help="Ray cluster to use (default: $RAY_ADDRESS)")
    p.add_argument("--ray-storage", choices=STORAGE, default="auto",
                   help="auto: a node that sees SWEEP_DIR trains into it, others copy the run back; "
                        "shared or copy force one way")
    p.add_argument("--resume", action="store_true",
                   help="continue SWEEP_DIR: finished runs are kept, unfinished ones restart")
    return p


# ------------------------------------------------------------------ the grid, checked before any write


def grid_of(args: argparse.Namespace, old: dict[str, Any] | None) -> Grid:
    """The grid from the flags, or on --resume the stored one (flags given must agree with it)."""
    given = (args.preset, args.data, args.lr, args.vary, args.train_args)
    stored = Grid.from_dict(old["grid"]) if old else None
    if stored is not None and not any(given):
        return stored
    grid = Grid(args.preset, args.data, args.lr or (), tuple(args.vary), tuple(args.train_args))
    if stored is not None and grid != stored:
        raise ValueError(f"--resume: {args.out} holds a sweep of another grid ({describe(stored)}); "
                         "leave the grid flags out to continue it")
    return grid


def describe(grid: Grid) -> str:
    vary = "".join(f" --vary {k}={','.join(v)}" for k, v in grid.vary)
    return (f"--preset {grid.preset} --data {grid.data} --lr {','.join(f'{r:g}' for r in grid.rates)}{vary}"
            + (f" {shlex.join(grid.train_args)}" if grid.train_args else ""))


def check_out(out: Path, resume: bool) -> dict[str, Any] | None:
    """SWEEP_DIR's sweep.json (on --resume), refusing to write over a sweep or other files."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a folder")
    old = read_book(out) if out.is_dir() else None
    if resume and old is None:
        raise ValueError(f"--resume: {out} holds no {SWEEP_FILE} to continue")
    if not resume and old is not None:
        raise ValueError(f"{out} already holds a sweep ({SWEEP_FILE}); pass --resume to continue it "
                         "or choose another --out")
    if not resume and out.is_dir() and any(out.iterdir()):
        raise ValueError(f"--out {out} is not empty; choose a new or empty folder")
    return old


class SweepLock:
    """An exclusive flock on SWEEP_DIR/.sweep.lock for the sweep's life: one driver per sweep."""

    def __init__(self, out: Path):
        self.path, self.fd = out / LOCK_FILE, -1

    def __enter__(self) -> SweepLock:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            raise ValueError(f"{self.path.parent} is being swept by another process") from None
        return self

    def __exit__(self, *exc: Any) -> None:
        self.path.unlink(missing_ok=True)
        os.close(self.fd)


# ------------------------------------------------------------------ running it


def default_workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def sweep(args: argparse.Namespace) -> int:
    old = check_out(args.out, args.resume)
    grid = grid_of(args, old)
    grid.check()
    workers = args.workers or default_workers()
    session = ray_session(workers, args.ray_address) if args.backend == "ray" else nullcontext()
    with session:  # connected before anything is written
        return run_grid(args, grid, old, workers)


def run_grid(args: argparse.Namespace, grid: Grid, old: dict[str, Any] | None, workers: int) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    with SweepLock(args.out):
        info = {"command": "python -m train.sweep " + shlex.join(args.argv), "backend": args.backend,
                "workers": workers}
        book = SweepBook(args.out, grid, info, old)
        jobs = book.jobs(args.resume)
        kept = len(grid.points()) - len(jobs)
        log.info("sweep: %d run(s) to train in %s (%d kept), %d at a time (%s)", len(jobs), args.out, kept,
                 workers, args.backend)
        t0 = time.monotonic()
        try:
            train_all(args, book, jobs, min(workers, max(len(jobs), 1)))
        except KeyboardInterrupt:
            book.close("interrupted")
            done = sum(r["status"] == "finished" for r in book.data["runs"])
            print(f"interrupted: {done} of {len(book.data['runs'])} runs finished ({args.out / SWEEP_FILE}); "
                  f"python -m train.sweep --out {args.out} --resume continues", file=sys.stderr)
            return EXIT_INTERRUPTED
        book.close("finished")
    return report(book, time.monotonic() - t0)


def train_all(args: argparse.Namespace, book: SweepBook, jobs: list[Job], workers: int) -> None:
    total = len(book.data["runs"])

    def ended(job: Job, code: int | None, seconds: float | None, error: str | None = None) -> None:
        entry = book.finish(job, code, seconds, error or last_line(job.log))
        done = sum(r["status"] in ("finished", "failed") for r in book.data["runs"])
        log.info("sweep: [%d/%d] %s", done, total, run_line(entry))

    grid = book.grid
    if args.backend == "local":
        run_local(jobs, grid.data, lambda job: grid.argv(job.point), workers, book.start, ended)
        return
    data = None if args.ray_storage == "shared" else Path(grid.data).read_bytes()
    spec = lambda job: {"id": book.id, "cwd": os.getcwd(), "sweep_dir": str(args.out), "data": grid.data,  # noqa: E731
                        "out": str(job.out), "log": str(job.log), "name": job.name,
                        "argv": grid.argv(job.point), "storage": args.ray_storage}
    run_ray(jobs, spec, data, args.workers or len(jobs), book.start, ended)


def last_line(path: Path) -> str | None:
    """The last line a failed run printed (its one-line error), for sweep.json."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return None
    return lines[-1][-300:] if lines else None


def run_line(entry: dict[str, Any]) -> str:
    """'lr=3e-04,qk_norm=rms: final val 2.314 (healthy) in 12 s', or how it diverged or failed."""
    name, status, secs = entry["name"], entry["status"], entry.get("seconds")
    took = f" in {secs:.0f} s" if secs is not None else ""
    if status == "failed":
        return f"{name}: failed (exit {entry.get('exit_code')}){took}: {entry.get('error') or 'see its log'}"
    if status == "interrupted":
        return f"{name}: interrupted at step {entry.get('last_step')}{took}"
    if entry.get("diverged_at") is not None:
        return f"{name}: diverged at step {entry['diverged_at']} ({entry.get('verdict')}){took}"
    final = entry.get("final_val_loss")
    return f"{name}: final val {final:.3f} ({entry.get('verdict')}){took}" if final is not None else f"{name}: finished{took}"


def report(book: SweepBook, seconds: float) -> int:
    for v in book.data["variants"]:
        sens = v["lr_sensitivity"]
        log.info("sweep: %s: LR sensitivity %s, stable rates %s", v["name"],
                 "-" if sens is None else f"{sens:.3f}", range_text(v["stable_range"]))
    failed = [r["name"] for r in book.data["runs"] if r["status"] == "failed"]
    log.info("sweep: done in %.0f s: python -m probes.sweep --ckpt %s", seconds, book.out)
    if failed:
        log.error("sweep: %d run(s) failed (see SWEEP_DIR/logs): %s", len(failed), ", ".join(failed))
        return EXIT_RUNS_FAILED
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m train.sweep`: 0 when every run finished (diverged ones too), 1 when a run failed,
    2 (one line) on bad input, 130 on Ctrl-C."""
    def body() -> int:
        args = build_parser().parse_args(argv)
        args.argv = sys.argv[1:] if argv is None else list(argv)
        logging.basicConfig(level=logging.INFO, format="%(name)s | %(levelname)s | %(asctime)s | %(message)s",
                            datefmt="%Y-%m-%d %H:%M:%S")
        return sweep(args)

    return run_cli(body)
