"""Training logs opened by themselves: the files the run doctor reads by their name (a printed
nanoGPT or llm.c log, trainer_state.json, a TensorBoard event file), a folder holding such files,
and the loss history the doctor read from one, for the Overview's curves.

`probes.doctor.sources` decides what a log is; this module only asks it, so that what the doctor
reads, the app opens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import streamlit as st

from models.store.nanochat_files import is_nanochat
from models.store.peek import holds_checkpoint
from models.store.record_check import MetricsLog
from models.store.run import METRICS_FILE, is_run_dir, read_metrics_log
from probes.doctor.read_tensorboard import EVENTS_PREFIX
from probes.doctor.read_trainer import STATE_FILE
from probes.doctor.sources import TEXT_LOGS, WANDB_SUFFIX, locate


def is_log_file(path: Path) -> bool:
    """A file the run doctor reads as a log by its name (`probes.doctor.sources.read_log_file`):
    trainer_state.json, a TensorBoard event file, a printed *.log / *.txt / *.out (nanoGPT's, llm.c's),
    a W&B run-<id>.wandb."""
    return path.is_file() and (path.name == STATE_FILE or path.name.startswith(EVENTS_PREFIX)
                               or path.suffix in TEXT_LOGS or path.suffix == WANDB_SUFFIX)


def logs_in(folder: Path) -> list[Path]:
    """The log files right in `folder` that the doctor reads (a folder of printed logs, say docs/)."""
    return [p for p in sorted(folder.iterdir()) if is_log_file(p)] if folder.is_dir() else []


def foreign_log(path: Path, event_levels: int = 2) -> tuple[str, Path] | None:
    """(kind, file or folder) of the other trainer's log the run doctor reads in `path` (or `path`,
    a log file), or None (a run of ours, or no log); TensorBoard events `event_levels` folders down."""
    return ("log", path) if is_log_file(path) else locate(path, event_levels)


def history_only(path: Path) -> bool:
    """A log file, or a folder holding another trainer's log and no checkpoint we read (llm.c's `-o`
    folder: main.log beside its own .bin weights; TensorBoard events alone): a history, no snapshot."""
    if is_log_file(path):
        return True
    return path.is_dir() and not is_run_dir(path) and foreign_log(path) is not None \
        and not holds_checkpoint(path) and not is_nanochat(path)


def unreadable(path: Path) -> ValueError | None:
    """Why the run doctor cannot read the log in `path` (a binary file, a Git LFS pointer, an empty
    log: its reader's error), or None; what it read stays cached for the Overview's curves."""
    try:
        history_log(path)
    except ValueError as exc:  # ProbeInputError (one line naming the file), or a reader's own
        return exc
    return None


def stamp(path: Path) -> float:
    """`path`'s modification time; 0 where it went between listing and reading (an atomic write's rename)."""
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def log_mtime(where: Path) -> float:
    """The newest modification time of a log file, or of the files right in a folder."""
    files = [where] if where.is_file() else [p for p in where.iterdir() if p.is_file() and not p.name.startswith(".")]
    return max((stamp(f) for f in files), default=0.0)  # a temporary renamed away meanwhile: 0


def history_log(source: Path) -> MetricsLog:
    """The loss history to draw: our run's metrics.jsonl, else the records the doctor read from
    another trainer's log in `source` (a log file, a Trainer output, TensorBoard events), in our
    names (step, train_loss, val_loss); raises ProbeInputError (one line) for an unusable log."""
    found = None if is_run_dir(source) else foreign_log(source)
    if found is None:
        return read_metrics_log(source) if source.is_dir() else MetricsLog(source / METRICS_FILE, [])
    return MetricsLog(found[1], _records(str(source), log_mtime(found[1])))


@st.cache_data(max_entries=64, show_spinner=False)
def _records(source: str, modified: float) -> list[dict[str, Any]]:
    from probes.doctor.run_history import RunHistory

    return RunHistory.read(source).records
