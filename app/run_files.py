"""What the app reads from a run's folder, with no model: its records, run.json, its data file,
the run doctor's report and its g/w/u history (both cached), and whether it is training now.
app/data.py holds the model side (loaded snapshots and the probes' results).
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import streamlit as st

from app.logs import foreign_log, log_mtime
from models.store.record_check import MetricsLog
from models.store.run import METRICS_FILE, is_run_dir, read_metrics_log, read_run_json

if TYPE_CHECKING:
    from probes import diagnose, updates

REPO = Path(__file__).resolve().parent.parent


def metrics(run: Path) -> list[dict[str, Any]]:
    """The run's records (tolerates a half-written last line: the reader skips it)."""
    return metrics_log(run).records


def metrics_log(run: Path) -> MetricsLog:
    """The run's records and the malformed ones the reader skipped (`read_metrics_log`)."""
    return read_metrics_log(run) if run.is_dir() else MetricsLog(run / METRICS_FILE, [])


def records_caption(log: MetricsLog) -> str:
    """'120 records, steps 0..2000', and how many malformed records the reader left out."""
    records = log.records
    text = f"{len(records)} records, steps {records[0]['step']}..{records[-1]['step']}" if records else "no records"
    return text + (f"; {log.skipped_text()}: the app's log says what is wrong with each" if log.skipped else "")


def run_info(run: Path) -> dict[str, Any]:
    """run.json as a dict; {} where it is missing or damaged (the Overview says what is wrong with a
    damaged file: the sidebar and the pages' hints, which read it too, must not fail over it)."""
    try:
        return (read_run_json(run) or {}) if is_run_dir(run) else {}
    except ValueError:  # CheckpointError: not JSON, not an object
        return {}


def run_json_part(run: Path, key: str) -> dict[str, Any]:
    """run.json's `key` mapping; {} where run.json is missing, damaged or holds no such mapping."""
    part = run_info(run).get(key)
    return part if isinstance(part, dict) else {}


def recorded_data(run: Path) -> str | None:
    """The data path a run's run.json records (relative to the repository for the shipped runs)."""
    path = run_json_part(run, "data").get("path")
    return path if isinstance(path, str) and path else None


def trained_context(run: Path) -> int | None:
    """The context length (n_ctx) a run trained with, from its run.json; None when it does not say."""
    n_ctx = run_json_part(run, "model").get("n_ctx")
    return n_ctx if isinstance(n_ctx, int) and n_ctx >= 2 else None


def data_file(run: Path) -> Path | None:
    """The text file a run was trained on, if it is still where run.json says: as recorded, from
    the repository root, beside the run, or by name in the repository's data/."""
    recorded = recorded_data(run)
    if not recorded:
        return None
    for candidate in (Path(recorded), REPO / recorded, run / recorded, REPO / "data" / Path(recorded).name):
        if candidate.is_file():
            return candidate
    return None


def random_passage(path: Path, length: int, seed: int) -> str:
    """A random slice of the data file, starting at a line."""
    text = path.read_text(encoding="utf-8", errors="replace")
    rng = random.Random(seed)
    start = rng.randrange(0, max(1, len(text) - length))
    start = text.find("\n", start) + 1 or start
    return text[start:start + length]


def update_history(run: Path, modified: float) -> updates.UpdateHistory:
    return _update_history(str(run), modified)


@st.cache_data(max_entries=16, show_spinner=False)
def _update_history(run: str, modified: float) -> updates.UpdateHistory:
    from probes import updates

    return updates.from_run(run)


def diagnosis(run: Path) -> diagnose.Diagnosis:
    """The run doctor's report on the run, or on another trainer's log in `run` (ProbeInputError, one
    line, for an unusable history); re-read when that history changes."""
    found = foreign_log(run)
    return _diagnosis(str(run), log_mtime(found[1]) if found else metrics_mtime(run))


@st.cache_data(max_entries=512, show_spinner=False)  # every run of a long run list: 16 thrashed on each rerun
def _diagnosis(run: str, modified: float) -> diagnose.Diagnosis:
    from probes import diagnose

    return diagnose.run(run)


def metrics_mtime(run: Path) -> float:
    path = run / "metrics.jsonl"
    return path.stat().st_mtime if path.is_file() else 0.0


def is_training(run: Path, within_s: float = 120.0) -> bool:
    """A run whose metrics were written in the last two minutes is probably still training."""
    import time

    return run.is_dir() and (time.time() - metrics_mtime(run)) < within_s and \
        os.path.exists(run / ".train.lock")
