"""SWEEP_DIR/sweep.json, kept by the sweep's driver (the only writer): the grid, one entry per run
(status, exit code, and what `probes.sweep_parts.stats.run_outcome` reads from the run's own files) and
per variant its LR sensitivity and widest stable range. Rewritten atomically whenever a run starts
or ends, so a sweep still running, interrupted or killed is readable as far as it got."""

from __future__ import annotations

import logging
import shutil
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from models.store.files import dumps_json, read_json_object, write_bytes_atomic
from models.store.run import CheckpointError
from probes.sweep_parts.file import check_sweep
from probes.sweep_parts.stats import SWEEP_FILE, run_finished, run_outcome, variant_summary
from train.run_lock import lock_holder
from train.sweep.grid import Grid, Point

log = logging.getLogger("train.sweep")

__all__ = ["FORMAT", "Job", "SweepBook", "read_book", "status_for"]

FORMAT = 1
LOGS = "logs"  # SWEEP_DIR/logs/<run>.log: each run's console output
INTERRUPTED = (130, 143)


@dataclass(frozen=True)
class Job:
    """One run to train: its point, its folder and log file (relative to the working directory)."""

    point: Point
    out: Path
    log: Path

    @property
    def name(self) -> str:
        return self.point.name


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def read_book(out: Path) -> dict[str, Any] | None:
    """sweep.json of `out`, or None when there is none."""
    path = out / SWEEP_FILE
    return check_sweep(read_json_object(path), path) if path.is_file() else None


def status_for(outcome: dict[str, Any], code: int | None) -> str:
    """finished (the metrics reach the last step, or the run diverged and stopped), interrupted
    (Ctrl-C or SIGTERM: a snapshot was saved, --resume restarts it) or failed."""
    if outcome and run_finished(outcome):
        return "finished"
    return "interrupted" if code in INTERRUPTED else "failed"


def outcome_of(run_dir: Path) -> dict[str, Any]:
    """run_outcome, or {} for a run that left no readable files (it failed at its start)."""
    try:
        return run_outcome(run_dir) if run_dir.is_dir() else {}
    except CheckpointError as err:
        log.warning("sweep: %s: %s", run_dir.name, err)
        return {}


class SweepBook:
    """sweep.json in memory: `start`/`finish` record a run and write the file."""

    def __init__(self, out: Path, grid: Grid, info: dict[str, Any], old: dict[str, Any] | None = None):
        self.out, self.grid = out, grid
        self.data: dict[str, Any] = {"format": FORMAT, "id": (old or {}).get("id") or uuid.uuid4().hex,
                                     **info, "grid": grid.to_dict(), "status": "running",
                                     "started": (old or {}).get("started") or now(), "runs": []}
        previous = {r.get("name"): r for r in (old or {}).get("runs", [])}
        for point in grid.points():
            entry = {"name": point.name, "lr": point.lr, "variant": point.variant,
                     "values": dict(point.values), "dir": point.name, "log": f"{LOGS}/{point.name}.log",
                     "status": "pending", "exit_code": None, "seconds": None}
            entry.update({k: v for k, v in previous.get(point.name, {}).items() if k in ("exit_code", "seconds")})
            self.data["runs"].append(entry)
        self.by_name = {r["name"]: r for r in self.data["runs"]}
        if old:  # the command that started the sweep stays; each --resume is added to its list
            self.data["command"] = old.get("command", info.get("command"))
            self.data["resumes"] = [*old.get("resumes", []), {"command": info.get("command"), "at": now()}]

    @property
    def id(self) -> str:
        return self.data["id"]

    def jobs(self, resume: bool) -> list[Job]:
        """The runs still to train. On --resume a finished run is kept as it is; an unfinished one
        is deleted (it restarts from step 0), unless a live process still trains it: then the
        resume is refused before anything changes (a driver killed with SIGKILL can leave one)."""
        self.refuse_live_runs()
        todo = []
        for point in self.grid.points():
            run_dir, entry = self.out / point.name, self.by_name[point.name]
            outcome = outcome_of(run_dir) if resume else {}
            if outcome and run_finished(outcome):
                entry.update(outcome, status="finished")
                continue
            entry.update(status="pending", exit_code=None, seconds=None)
            if run_dir.exists():
                log.info("sweep: %s did not finish: deleting it to train it again", point.name)
                shutil.rmtree(run_dir)
            todo.append(Job(point, self.out / point.name, self.out / LOGS / f"{point.name}.log"))
        (self.out / LOGS).mkdir(parents=True, exist_ok=True)
        self.write()
        return todo

    def refuse_live_runs(self) -> None:
        live = [(point.name, pid) for point in self.grid.points()
                if (pid := lock_holder(self.out / point.name)) is not None]
        if live:
            runs = ", ".join(f"{name} (pid {pid})" for name, pid in live)
            raise ValueError(f"{self.out}: {len(live)} run(s) are still being trained by another process: "
                             f"{runs}; wait for them to end (or stop them), then --resume")

    def start(self, job: Job) -> None:
        self.by_name[job.name]["status"] = "running"
        self.write()

    def finish(self, job: Job, code: int | None, seconds: float | None, error: str | None = None) -> dict[str, Any]:
        """Record a run that ended: its exit code and what its files say (the doctor included)."""
        entry = self.by_name[job.name]
        outcome = outcome_of(self.out / job.name)
        entry.update(outcome, exit_code=code, seconds=None if seconds is None else round(seconds, 1),
                     status=status_for(outcome, code))
        entry.pop("error", None)
        if error and entry["status"] == "failed":
            entry["error"] = error
        self.write()
        return entry

    def close(self, status: str) -> None:
        self.data["status"] = status
        self.write()

    def variants(self) -> list[dict[str, Any]]:
        out = []
        for point in self.grid.variants():
            runs = [r for r in self.data["runs"] if r["variant"] == point.variant]
            out.append({"name": point.variant, "values": dict(point.values), **variant_summary(runs)})
        return out

    def write(self) -> None:
        self.data["updated"] = now()
        self.data["variants"] = self.variants()
        write_bytes_atomic(self.out / SWEEP_FILE, (dumps_json(self.data, indent=2) + "\n").encode("utf-8"))
