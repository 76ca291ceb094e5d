"""The development readings cached beside each snapshot (`probes.development`), torch-free: one JSON
file, `development.json` in a snapshot directory or `NAME.development.json` beside a checkpoint file,
holding ``format_version``, ``weights_sha256`` (config.json's hash of the weights with the weights
file's own fingerprint, its size and the sha256 of its first and last MiB: weights replaced or cut
short under a config.json that stayed; else the weights file's sha256), ``inputs_sha256`` (the
text windows' and the repeat's) and ``reading``. A file of other weights or inputs, or of another
format version, is recomputed (a log line); a damaged one too (a warning), a reading of the wrong
shape included (never trusted); a run that cannot be written to is read, not cached.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from probes.doctor.log_file import is_number

log = logging.getLogger("probes.development")  # its lines are the development's

__all__ = ["CACHE_NAME", "READING_VERSION", "cache_path", "read_cache", "reading_problem", "weights_file", "weights_key", "write_cache"]

READING_VERSION = 1  # bump when what a reading holds changes: older caches are recomputed
CACHE_NAME = "development.json"


def cache_path(snapshot: Path) -> Path:
    return snapshot / CACHE_NAME if snapshot.is_dir() else snapshot.with_name(f"{snapshot.stem}.{CACHE_NAME}")


def weights_key(snapshot: Path) -> str | None:
    """The weights' key: config.json's hash (ours, the Monitor's) and the weights file's fingerprint,
    else the sha256 of the weights file."""
    from models.store.files import sha256_of

    found = weights_file(snapshot)
    config = snapshot / "config.json"
    if config.is_file():
        try:
            recorded = json.loads(config.read_text()).get("tensors_sha256")
        except (OSError, ValueError, AttributeError, RecursionError):
            recorded = None
        if isinstance(recorded, str):
            return f"{recorded}:{fingerprint(found)}" if found is not None else recorded
    return None if found is None else sha256_of(found)


def weights_file(snapshot: Path) -> Path | None:
    """The file holding a snapshot's weights: itself (a checkpoint file), or the one in its folder."""
    files = [snapshot] if snapshot.is_file() else [snapshot / n for n in ("model.safetensors", "pytorch_model.bin")]
    return next((f for f in files if f.is_file()), None)


def fingerprint(path: Path) -> str:
    """The file's size and the sha256 of its first and last MiB: what changes when weights are
    replaced or cut short, read in two blocks whatever the size."""
    import hashlib

    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(0)
            digest = hashlib.sha256(f.read(1 << 20))
            f.seek(max(size - (1 << 20), 0))
            digest.update(f.read(1 << 20))
    except OSError:
        return "unreadable"  # the load says why
    return f"{size}:{digest.hexdigest()[:32]}"


def read_cache(where: Path, weights: str, inputs: str) -> dict[str, Any] | None:
    if not where.is_file():
        return None
    try:
        saved = json.loads(where.read_text())
        if (saved["format_version"] == READING_VERSION and saved["weights_sha256"] == weights
                and saved["inputs_sha256"] == inputs):
            problem = reading_problem(saved["reading"])
            if problem is None:
                return saved["reading"]
            log.warning("%s holds a reading of the wrong shape (%s): recomputed", where, problem)
            return None
        log.info("%s was read from other weights or inputs (or by another version): recomputed", where)
    except RecursionError:
        log.warning("%s is damaged (JSON nested past what Python reads): recomputed", where)
    except (OSError, ValueError, KeyError, TypeError) as err:
        log.warning("%s is damaged (%s): recomputed", where, err)
    return None


def grid_shape(grid: Any) -> tuple[int, int] | None:
    """(layers, heads) of a [layer][head] grid of numbers (None where not read), else None."""
    if not isinstance(grid, list) or not grid or not all(isinstance(row, list) for row in grid):
        return None
    if len({len(row) for row in grid}) != 1 or not all(v is None or is_number(v) for row in grid for v in row):
        return None
    return len(grid), len(grid[0])


def reading_problem(reading: Any) -> str | None:
    """What is wrong with the shape of a cached reading (`probes.development.measure`'s), or None."""
    if not isinstance(reading, dict):
        return f"a {type(reading).__name__}, not an object"
    shape = grid_shape(reading.get("entropy"))
    if shape is None:
        return "no [layer][head] entropy grid"
    scores = reading.get("scores")
    if not isinstance(scores, dict):
        return "no scores"
    for name in ("previous_token", "duplicate_token", "sink", "induction", "induction_repeat"):
        if (name != "induction_repeat" or scores.get(name) is not None) and grid_shape(scores.get(name)) != shape:
            return f"scores.{name} is no {shape[0]}x{shape[1]} grid like the entropy's"
    for name in ("loss", "icl_score", "repeat_loss"):
        if reading.get(name) is not None and not is_number(reading[name]):
            return f"{name} is no number"
    points, kl = reading.get("lens_points"), reading.get("lens_kl")
    if (points is None) != (kl is None) or points is not None and not (
            isinstance(points, list) and isinstance(kl, list) and len(points) == len(kl)
            and all(isinstance(p, str) for p in points) and all(v is None or is_number(v) for v in kl)):
        return "lens_points and lens_kl do not pair"
    if not isinstance(reading.get("missing", []), list) or not is_int(reading.get("step")):
        return "no whole step or missing list"
    return None


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def write_cache(where: Path, weights: str, inputs: str, reading: dict[str, Any]) -> None:
    from models.cli import to_jsonable
    from models.store.files import write_bytes_atomic  # torch-free

    body = {"format_version": READING_VERSION, "weights_sha256": weights, "inputs_sha256": inputs,
            "reading": to_jsonable(reading)}
    try:
        write_bytes_atomic(where, json.dumps(body, separators=(",", ":")).encode())
    except OSError as err:  # a read-only run is still read, only not cached
        log.warning("could not cache the development reading at %s: %s", where, err)
