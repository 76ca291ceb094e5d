"""A run that trains while a test watches: a copy of the shipped attn1_residual (snapshots at
0/500/1000/2000, a record every 50 steps) cut at a step, then grown the way `python -m train`
writes a run: records appended to metrics.jsonl, a snapshot renamed into place whole, a
`.train.lock` held throughout (so the app's `run_files.is_training` says it trains)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

SHIPPED = Path(__file__).resolve().parent.parent / "checkpoints" / "attn1_residual"


def records() -> list[str]:
    return SHIPPED.joinpath("metrics.jsonl").read_text().splitlines(keepends=True)


def start_run(run: Path, upto: int) -> Path:
    """`run`: run.json, the records and snapshots up to step `upto`, and the trainer's lock."""
    run.mkdir(parents=True)
    shutil.copy(SHIPPED / "run.json", run / "run.json")
    (run / "metrics.jsonl").write_text("".join(r for r in records() if json.loads(r)["step"] <= upto))
    for snap in sorted(SHIPPED.glob("step_*")):
        if int(snap.name[5:]) <= upto:
            shutil.copytree(snap, run / snap.name)
    (run / ".train.lock").write_text("12345\n")
    return run


def grow(run: Path, upto: int, snapshots: bool = True) -> None:
    """Append the records after the run's last one up to step `upto`, and (unless `snapshots` is
    False) the snapshots up to `upto` it lacks, each renamed in whole."""
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["step"]
    with open(run / "metrics.jsonl", "a") as f:
        f.write("".join(r for r in records() if last < json.loads(r)["step"] <= upto))
    for snap in sorted(SHIPPED.glob("step_*")) if snapshots else []:
        if int(snap.name[5:]) <= upto and not (run / snap.name).exists():
            staging = run.parent.parent / f".{run.name}.{snap.name}.tmp"  # outside the runs folder
            shutil.copytree(snap, staging)
            staging.rename(run / snap.name)
