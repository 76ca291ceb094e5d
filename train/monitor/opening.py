"""Opening a run directory for the Monitor: lock it (unless the caller holds its lock, as our
trainer does), refuse to mix with an old run, and write run.json."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from models.cli import to_jsonable
from models.store.files import writing
from models.store.run import METRICS_FILE, list_snapshots, read_run_json, write_run_json
from train.run_lock import RunLock
from train.monitor.parts import resume_mismatch

__all__ = ["open_run"]


def open_run(out_dir: Path, *, resume: bool, lock: bool, run_info: dict[str, Any] | None,
             describe: Callable[[], dict[str, Any]]) -> RunLock | None:
    """Make and lock `out_dir`; returns the lock held (None without `lock`), released again on error.

    run.json: `run_info` when given (the caller merged any older one), else `describe()` (the
    Monitor's own description of the model and optimizer), kept as it is when resuming a run that
    has one; a resume onto another model is refused, naming both."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"Monitor: {out_dir} exists and is not a directory")
    old = (out_dir / METRICS_FILE).is_file() or bool(list_snapshots(out_dir)) if out_dir.is_dir() else False
    if old and not resume:
        raise ValueError(f"Monitor: {out_dir} already holds a run (metrics.jsonl or snapshots); "
                         "pass resume=True to continue it, or choose another directory")
    with writing(out_dir):
        out_dir.mkdir(parents=True, exist_ok=True)
    held = take_lock(out_dir) if lock else None
    try:
        write_run_info(out_dir, resume, run_info, describe)
    except BaseException:
        if held is not None:
            held.release()
        raise
    return held


def take_lock(out_dir: Path) -> RunLock:
    try:
        return RunLock(out_dir).acquire()
    except ValueError as busy:  # the lock speaks to `python -m train` (--out): say it our way
        held = str(busy).split(";")[0]
        if f"(pid {os.getpid()})" in held:  # a second Monitor on one directory in one process
            held = held[:-1] + ", this process itself: another Monitor holds it, close that one first)"
        raise ValueError(f"Monitor: {held}; wait for it to finish or choose another directory") from None


def write_run_info(out_dir: Path, resume: bool, run_info: dict[str, Any] | None,
                   describe: Callable[[], dict[str, Any]]) -> None:
    old = read_run_json(out_dir) if resume else None
    if run_info is None and old:  # records made now must fit the model run.json names
        new = describe()
        why = resume_mismatch(old, new)
        if why:
            raise ValueError(f"Monitor: resume=True on {out_dir}, but it is another model: {why}; "
                             "choose another directory for this model")
        if old.get("model") is None and new["model"] is not None:  # eval_tokens given only now
            write_run_json(out_dir, to_jsonable({**old, "model": new["model"]}))
    if run_info is not None or not old:
        write_run_json(out_dir, to_jsonable(run_info if run_info is not None else describe()))
