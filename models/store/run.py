"""Run directories and durable file writes.

A run is a directory of snapshots ``step_000000/ step_000500/ ...`` plus ``metrics.jsonl`` (one
JSON object per logged step) and ``run.json``. Dot-directories (temporary or set-aside snapshots
of an interrupted save) are never listed. Every write here fsyncs; whole-file writes go to a
temporary name in the same directory first and are renamed into place.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["CheckpointError", "METRICS_FILE", "RUN_FILE", "append_metrics", "fsync_dir", "fsync_file",
           "is_run_dir", "is_snapshot_dir", "latest_snapshot", "list_snapshots", "read_metrics",
           "read_run_json", "snapshot_name", "snapshot_step", "write_bytes_atomic", "write_run_json"]

METRICS_FILE = "metrics.jsonl"
RUN_FILE = "run.json"
SNAPSHOT_CONFIG = "config.json"
_SNAPSHOT_RE = re.compile(r"^step_(\d{6,})$")


class CheckpointError(ValueError):
    """A checkpoint, run directory or metrics file is missing, malformed or inconsistent."""


# --------------------------------------------------------------------------- durable writes


def fsync_file(path: str | Path) -> None:
    """Flush a file's contents to disk."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: str | Path) -> None:
    """Make renames inside a directory durable (POSIX); a no-op where directories can't be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def current_umask() -> int:
    """The process umask (reading it means setting it, so it is put straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to a temporary file beside ``path``, fsync, rename over ``path``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp makes 0600; a plain open() honours the umask
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def _json_default(obj: Any) -> Any:
    """Tensors, numpy scalars/arrays and paths in records become plain JSON values."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def dumps_json(obj: Any, **kwargs: Any) -> str:
    return json.dumps(obj, default=_json_default, **kwargs)


# --------------------------------------------------------------------------- run directories


def snapshot_name(step: int) -> str:
    """The directory name of the snapshot taken at ``step``: ``step_000500``."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    return f"step_{step:06d}"


def snapshot_step(path: str | Path) -> int | None:
    """The step encoded in a snapshot directory's name, or None if it is not ``step_NNNNNN``."""
    match = _SNAPSHOT_RE.match(Path(path).name)
    return int(match.group(1)) if match else None


def is_snapshot_dir(path: str | Path) -> bool:
    """A directory holding a snapshot's ``config.json``."""
    path = Path(path)
    return path.is_dir() and (path / SNAPSHOT_CONFIG).is_file()


def _step_dirs(run_dir: Path) -> list[Path]:
    return [p for p in run_dir.iterdir() if snapshot_step(p) is not None and p.is_dir()]


def is_run_dir(path: str | Path) -> bool:
    """A directory (not itself a snapshot) with step_NNNNNN/ snapshots, metrics.jsonl or run.json."""
    path = Path(path)
    if not path.is_dir() or is_snapshot_dir(path):
        return False
    return bool((path / RUN_FILE).is_file() or (path / METRICS_FILE).is_file() or _step_dirs(path))


def list_snapshots(run_dir: str | Path) -> list[Path]:
    """The run's ``step_NNNNNN`` snapshot directories sorted by step (dot-directories ignored)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir}: run directory not found")
    return sorted(_step_dirs(run_dir), key=lambda p: snapshot_step(p) or 0)


def latest_snapshot(run_dir: str | Path) -> Path:
    """The snapshot with the highest step; CheckpointError if the run has none yet."""
    snapshots = list_snapshots(run_dir)
    if not snapshots:
        raise CheckpointError(f"{run_dir}: run directory has no step_NNNNNN snapshots yet")
    return snapshots[-1]


def write_run_json(run_dir: str | Path, data: dict[str, Any]) -> Path:
    """Write ``run.json`` (the run's description: preset, train config, ...) atomically."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    return write_bytes_atomic(run_dir / RUN_FILE, (dumps_json(data, indent=2) + "\n").encode())


def read_run_json(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's ``run.json`` as a dict, or None if there is none."""
    path = Path(run_dir) / RUN_FILE
    return read_json_object(path) if path.is_file() else None


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file holding one object; anything else is a CheckpointError naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


# --------------------------------------------------------------------------- metrics.jsonl


def _metrics_path(run_dir: str | Path) -> Path:
    path = Path(run_dir)
    return path if path.suffix == ".jsonl" else path / METRICS_FILE


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The records of ``metrics.jsonl`` (a run directory or the file itself).

    A line that is not a JSON object, or whose ``step`` is not a non-negative integer (a crash
    mid-write, a hand edit), is skipped with a warning naming the file and the line; the rest of
    the history stays readable. No file yet means no records.
    """
    path = _metrics_path(run_dir)
    if not path.parent.is_dir():
        raise CheckpointError(f"{path.parent}: run directory not found")
    if not path.is_file():
        return []
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({exc})") from None
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError(f"expected a JSON object, got {type(record).__name__}")
            step = record.get("step")
            if isinstance(step, bool) or not isinstance(step, int) or step < 0:
                raise ValueError(f"'step' must be a non-negative integer, got {step!r}")
        except ValueError as exc:
            last = number == len(lines)
            logger.warning("%s: skipping %sline %d (%s)", path, "truncated last " if last else "", number,
                           str(exc)[:120])
            continue
        records.append(record)
    return records


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


def append_metrics(run_dir: str | Path, record: dict[str, Any]) -> None:
    """Append one record as a JSON line to the run's ``metrics.jsonl``; flush and fsync."""
    if not isinstance(record, dict):
        raise ValueError(f"a metrics record must be a dict, got {type(record).__name__}")
    line = dumps_json(record) + "\n"
    path = _metrics_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as f:
        _drop_partial_last_line(f)
        f.seek(0, os.SEEK_END)
        f.write(line.encode("utf-8"))
        f.flush()
        os.fsync(f.fileno())
