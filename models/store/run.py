"""Our run directories, and folders of nanoGPT checkpoints read as runs.

A run is a directory of snapshots ``step_000000/ step_000500/ ...`` plus ``metrics.jsonl`` (one
JSON object per logged step) and ``run.json``. Dot-directories (temporary or set-aside snapshots
of an interrupted save) are never listed. A folder of numbered checkpoint files (``ckpt_500.pt``,
``ckpt-1000.pt``, ``2000.pt``: what a nanoGPT user who saves every N steps has) is a run too:
its snapshots are those files, its step the number in each name. Torch-free.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from models.store.files import (CheckpointError, dumps_json, fsync_file, read_json_object,  # noqa: F401
                                write_bytes_atomic, writing)
from models.store.record_check import (MetricsLog, RunShape, Skipped, in_order, out_of_order, problem,
                                       run_shape)

logger = logging.getLogger(__name__)

__all__ = ["METRICS_FILE", "RUN_FILE", "append_metrics", "sync_metrics", "is_run_dir", "is_snapshot_dir",
           "latest_snapshot", "list_snapshots", "read_metrics", "read_metrics_log", "read_run_json",
           "run_model_config", "snapshot_name",
           "snapshot_step", "trim_metrics", "write_run_json", "checkpoint_files"]

METRICS_FILE = "metrics.jsonl"
RUN_FILE = "run.json"
SNAPSHOT_CONFIG = "config.json"
_SNAPSHOT_RE = re.compile(r"^step_(\d{6,})$")
# a numbered checkpoint file: an optional word and separator, the step, .pt (not "mha4.pt")
_CKPT_FILE_RE = re.compile(r"^(?:[A-Za-z]+[_\-])?(\d+)\.(?:pt|pth)$")


# --------------------------------------------------------------------------- run directories


def snapshot_name(step: int) -> str:
    """The directory name of the snapshot taken at ``step``: ``step_000500``."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    return f"step_{step:06d}"


def snapshot_step(path: str | Path) -> int | None:
    """The step encoded in a snapshot's name (``step_000500``, or a numbered checkpoint file such
    as ``ckpt_500.pt``), or None if the name holds none."""
    name = Path(path).name
    match = _SNAPSHOT_RE.match(name) or _CKPT_FILE_RE.match(name)
    return int(match.group(1)) if match else None


def is_snapshot_dir(path: str | Path) -> bool:
    """A directory holding a snapshot's ``config.json``."""
    path = Path(path)
    return path.is_dir() and (path / SNAPSHOT_CONFIG).is_file()


def _step_dirs(run_dir: Path) -> list[Path]:
    return [p for p in run_dir.iterdir() if _SNAPSHOT_RE.match(p.name) and p.is_dir()]


def checkpoint_files(folder: str | Path) -> list[Path]:
    """The numbered checkpoint files (``ckpt_500.pt``, ...) directly inside ``folder``."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return [p for p in folder.iterdir() if _CKPT_FILE_RE.match(p.name) and p.is_file()]


def is_run_dir(path: str | Path) -> bool:
    """A directory (not itself a snapshot) with step_NNNNNN/ snapshots, metrics.jsonl or run.json,
    or a folder of numbered checkpoint files."""
    path = Path(path)
    if not path.is_dir() or is_snapshot_dir(path):
        return False
    return bool((path / RUN_FILE).is_file() or (path / METRICS_FILE).is_file() or _step_dirs(path)
                or checkpoint_files(path))


def list_snapshots(run_dir: str | Path) -> list[Path]:
    """The run's snapshots sorted by step: its ``step_NNNNNN`` directories (dot-directories
    ignored), or for a folder of checkpoint files without any, those files."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir}: run directory not found")
    found = _step_dirs(run_dir) or checkpoint_files(run_dir)
    return sorted(found, key=lambda p: (snapshot_step(p) or 0, p.name))


def latest_snapshot(run_dir: str | Path) -> Path:
    """The snapshot with the highest step; CheckpointError if the run has none yet."""
    snapshots = list_snapshots(run_dir)
    if not snapshots:
        raise CheckpointError(f"{run_dir}: run directory has no step_NNNNNN snapshots yet")
    return snapshots[-1]


def write_run_json(run_dir: str | Path, data: dict[str, Any]) -> Path:
    """Write ``run.json`` (the run's description: preset, train config, ...) atomically."""
    run_dir = Path(run_dir)
    with writing(run_dir):
        run_dir.mkdir(parents=True, exist_ok=True)
        return write_bytes_atomic(run_dir / RUN_FILE, (dumps_json(data, indent=2) + "\n").encode())


def read_run_json(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's ``run.json`` as a dict, or None if there is none."""
    path = Path(run_dir) / RUN_FILE
    return read_json_object(path) if path.is_file() else None


# --------------------------------------------------------------------------- metrics.jsonl


def _metrics_path(run_dir: str | Path) -> Path:
    path = Path(run_dir)
    return path if path.suffix == ".jsonl" else path / METRICS_FILE


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The records of ``metrics.jsonl`` (a run directory or the file itself) that pass the check
    of :mod:`models.store.record_check`: see :func:`read_metrics_log`."""
    return read_metrics_log(run_dir).records


def read_metrics_log(run_dir: str | Path) -> MetricsLog:
    """``metrics.jsonl`` read with every record checked against the run's model (run.json, else
    the newest snapshot's config.json): a line that is not a JSON object, or whose step, numbers
    or per-layer fields do not fit (``record_check.problem``), or whose step goes back, is skipped
    with a warning naming the file, the line and what is wrong, and listed in ``skipped``; the rest
    of the history stays readable. A last line cut short with no newline after it is a write in
    progress (a trainer mid-append) or one a kill cut off: warned about, but not counted among the
    malformed (`append_metrics` drops it before its next write). No file yet means no records."""
    path = _metrics_path(run_dir)
    if not path.parent.is_dir():
        raise CheckpointError(f"{path.parent}: run directory not found")
    if not path.is_file():
        return MetricsLog(path, [])
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
        lines = text.splitlines()
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({exc})") from None
    shape = run_shape(_model_or_none(path.parent))
    numbered, skipped = [], []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            record, why, truncated = _parse(line, shape, last=number == len(lines))
            if why is None:
                numbered.append((number, record))
            elif truncated and not text.endswith("\n"):
                _warn_once(path, Skipped(number, why, truncated))
            else:
                skipped.append(Skipped(number, why, truncated))
    kept = in_order([r["step"] for _, r in numbered])
    steps = [r["step"] if i in kept else None for i, (_, r) in enumerate(numbered)]
    skipped += [Skipped(number, out_of_order(steps, i, record["step"]))
                for i, (number, record) in enumerate(numbered) if i not in kept]
    skipped.sort(key=lambda s: s.line)
    for s in skipped:
        _warn_once(path, s)
    return MetricsLog(path, [r for i, (_, r) in enumerate(numbered) if i in kept], skipped)


def _parse(line: str, shape: RunShape | None, last: bool) -> tuple[Any, str | None, bool]:
    """(record, None, False), or (None, what is wrong with the line, a JSON cut short at the end)."""
    try:
        record = json.loads(line)
    except ValueError as exc:
        return None, str(exc)[:120], last
    except RecursionError:
        return None, "nested too deep", False
    return record, problem(record, shape), False


_warned: set[tuple[str, int, str]] = set()  # a record the app or a Monitor re-reads is warned about once


def _warn_once(path: Path, skipped: Skipped) -> None:
    key = (str(path), skipped.line, skipped.reason)
    if key not in _warned:
        _warned.add(key)
        logger.warning("%s: skipping %sline %d (%s)", path, "truncated last " if skipped.truncated else "",
                       skipped.line, skipped.reason)


def run_model_config(run_dir: str | Path) -> dict[str, Any]:
    """The run's model config: run.json's, else that of the newest snapshot's config.json (JSON
    only, no weights read); {} when neither has one."""
    run_dir = Path(run_dir)
    model = (read_run_json(run_dir) or {}).get("model")
    if isinstance(model, dict):
        return model
    for snapshot in reversed(list_snapshots(run_dir)):
        try:
            config = read_json_object(snapshot / SNAPSHOT_CONFIG)
        except CheckpointError:
            continue
        if isinstance(config.get("model"), dict):
            return config["model"]
    return {}


def _model_or_none(run_dir: Path) -> dict[str, Any] | None:
    """The model config the records are checked against; None when run.json is unreadable (the
    records are then checked without it: whoever reads run.json reports it)."""
    try:
        return run_model_config(run_dir) or None
    except CheckpointError:
        return None


def _drop_partial_last_line(f) -> None:
    """If the file does not end in a newline, cut the interrupted last record off."""
    end = f.seek(0, os.SEEK_END)
    if end == 0:
        return
    f.seek(end - 1)
    if f.read(1) == b"\n":
        return
    pos, chunk = end, 1 << 16
    while pos > 0:
        start = max(0, pos - chunk)
        f.seek(start)
        block = f.read(pos - start)
        cut = block.rfind(b"\n")
        if cut >= 0:
            pos = start + cut + 1
            break
        pos = start
    logger.warning("%s: dropping a truncated last line (%d bytes)", f.name, end - pos)
    f.truncate(pos)


def trim_metrics(run_dir: str | Path, step: int) -> None:
    """On resume, drop the records logged after `step` (the snapshot continued from: they are
    redone). Every other line stays as it was, a malformed one included (the readers skip it with
    a warning, as before): rewriting from the records the checked reader kept lost those lines.
    The file is rewritten atomically."""
    path = _metrics_path(run_dir)
    if not path.is_file():
        return
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    kept = [line for line in lines if not _logged_after(line, step)]
    if len(kept) != len(lines):
        logger.info("resume: dropping %d metrics record(s) after step %d", len(lines) - len(kept), step)
        with writing(run_dir):
            write_bytes_atomic(path, "".join(line + "\n" for line in kept).encode("utf-8"))


def _logged_after(line: str, step: int) -> bool:
    """A well-formed record whose integer step is past `step` (anything else is kept)."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return False
    logged = record.get("step") if isinstance(record, dict) else None
    return isinstance(logged, int) and not isinstance(logged, bool) and logged > step


def append_metrics(run_dir: str | Path, record: dict[str, Any], *, sync: bool = True) -> None:
    """Append one record as a JSON line to the run's ``metrics.jsonl``; flush, and fsync unless
    `sync` is False (the line is then the OS's: a killed process keeps it, a machine crash may not)."""
    if not isinstance(record, dict):
        raise ValueError(f"a metrics record must be a dict, got {type(record).__name__}")
    line = dumps_json(record) + "\n"
    path = _metrics_path(run_dir)
    with writing(path.parent):
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a+b", buffering=0) as f:  # unbuffered: nothing left to write at close after a failure
            _drop_partial_last_line(f)
            end = f.seek(0, os.SEEK_END)
            data = memoryview(line.encode("utf-8"))
            try:
                while data:  # a raw write may write part of it
                    data = data[f.write(data):]
            except OSError:  # a disk filling up: the part written is cut back, the lines before stay whole
                _cut_back(f, end)
                raise
            if sync:
                os.fsync(f.fileno())


def _cut_back(f: Any, end: int) -> None:
    try:
        f.truncate(end)
    except OSError:  # left to the next append (`_drop_partial_last_line`) and the readers
        pass


def sync_metrics(run_dir: str | Path) -> None:
    """fsync the run's ``metrics.jsonl`` (lines appended with `sync=False` reach the disk), if it exists."""
    path = _metrics_path(run_dir)
    if path.is_file():
        fsync_file(path)
