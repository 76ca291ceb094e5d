"""The development readings cached beside each snapshot (`probes.development`), torch-free: one JSON
file, `development.json` in a snapshot directory or `NAME.development.json` beside a checkpoint file,
holding ``format_version``, ``weights_sha256`` (config.json's hash of the weights, else the weights
file's sha256), ``inputs_sha256`` (the text windows' and the repeat's) and ``reading``. A file of
other weights or inputs, or of another format version, is recomputed (a log line); a damaged one too
(a warning); a run that cannot be written to is read, not cached.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("probes.development")  # its lines are the development's

__all__ = ["CACHE_NAME", "READING_VERSION", "cache_path", "read_cache", "weights_key", "write_cache"]

READING_VERSION = 1  # bump when what a reading holds changes: older caches are recomputed
CACHE_NAME = "development.json"


def cache_path(snapshot: Path) -> Path:
    return snapshot / CACHE_NAME if snapshot.is_dir() else snapshot.with_name(f"{snapshot.stem}.{CACHE_NAME}")


def weights_key(snapshot: Path) -> str | None:
    """The weights' hash: config.json's (ours, the Monitor's), else the sha256 of the weights file."""
    from models.store.files import sha256_of

    config = snapshot / "config.json"
    if config.is_file():
        try:
            recorded = json.loads(config.read_text()).get("tensors_sha256")
        except (OSError, ValueError, AttributeError):
            recorded = None
        if isinstance(recorded, str):
            return recorded
    files = [snapshot] if snapshot.is_file() else [snapshot / n for n in ("model.safetensors", "pytorch_model.bin")]
    found = next((f for f in files if f.is_file()), None)
    return None if found is None else sha256_of(found)


def read_cache(where: Path, weights: str, inputs: str) -> dict[str, Any] | None:
    if not where.is_file():
        return None
    try:
        saved = json.loads(where.read_text())
        if (saved["format_version"] == READING_VERSION and saved["weights_sha256"] == weights
                and saved["inputs_sha256"] == inputs):
            return saved["reading"]
        log.info("%s was read from other weights or inputs (or by another version): recomputed", where)
    except (OSError, ValueError, KeyError, TypeError) as err:
        log.warning("%s is damaged (%s): recomputed", where, err)
    return None


def write_cache(where: Path, weights: str, inputs: str, reading: dict[str, Any]) -> None:
    from models.cli import to_jsonable
    from models.store.files import write_bytes_atomic  # torch-free

    body = {"format_version": READING_VERSION, "weights_sha256": weights, "inputs_sha256": inputs,
            "reading": to_jsonable(reading)}
    try:
        write_bytes_atomic(where, json.dumps(body, separators=(",", ":")).encode())
    except OSError as err:  # a read-only run is still read, only not cached
        log.warning("could not cache the development reading at %s: %s", where, err)
