"""`first_view.safetensors` beside a snapshot: what its pages show first (`probes.first_view` says
what and packs it), written and read without torch.

The file holds named numpy arrays and, in its metadata under "first_view", one JSON object:
``format_version``, ``weights_sha256`` (config.json's sha256 of the weights the view was read
from: a view of other weights is stale and never read), ``tokens`` (the [pos] ids the view read),
``text`` (the text they encode; null for a saved sample's row), ``skipped`` (part -> why it was
not read), ``arrays_sha256`` (the arrays hashed with the weights' sha256: arrays changed after
the view was written, or a view without it, are never drawn as the model's numbers) and ``parts`` (the skeleton `probes.first_view.unpack` reads the arrays with). It is
optional: a snapshot without one (or with a stale one) is read from its model. It is read only while
the snapshot's weights hash to what config.json records (one pass over the file: ~25 ms for the
7 MB shakespeare_gpt), so that a truncated or modified model.safetensors is never hidden behind
its view: the page loads the model, and loading says what is wrong.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from models.store.files import CheckpointError, dumps_json, sha256_of, write_bytes_atomic
from models.store.front import MODEL_FILE

__all__ = ["VIEW_FILE", "VIEW_VERSION", "arrays_digest", "read_view", "write_view"]

VIEW_FILE = "first_view.safetensors"
VIEW_VERSION = 1
KEY = "first_view"

log = logging.getLogger(__name__)


def write_view(directory: str | Path, arrays: dict[str, np.ndarray], info: dict[str, Any]) -> Path:
    """Write the view atomically into the snapshot `directory`; `info` holds all but format_version."""
    from safetensors.numpy import save

    meta = {"format_version": VIEW_VERSION, **info, "arrays_sha256": arrays_digest(arrays, info.get("weights_sha256"))}
    data = save({name: np.ascontiguousarray(a) for name, a in arrays.items()},
                metadata={KEY: dumps_json(meta, separators=(",", ":"))})
    return write_bytes_atomic(Path(directory) / VIEW_FILE, data)


def arrays_digest(arrays: dict[str, np.ndarray], weights_sha256: Any) -> str:
    """sha256 of the weights' sha256 and each array's name, dtype, shape and bytes, in name order."""
    digest = hashlib.sha256(str(weights_sha256).encode("utf-8"))
    for name in sorted(arrays):
        array = np.ascontiguousarray(arrays[name])
        digest.update(f"\n{name}:{array.dtype.str}:{list(array.shape)}\n".encode("utf-8"))
        digest.update(array.tobytes())
    return digest.hexdigest()


def read_view(directory: str | Path, weights_sha256: Any) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
    """(arrays, info) of the view saved beside the snapshot, or None (logged) when it has none, the one it
    has was read from other weights than `weights_sha256` (config.json's), or the snapshot's weights
    file does not hash to it; a damaged view file is a CheckpointError naming it."""
    from safetensors import SafetensorError, safe_open

    path = Path(directory) / VIEW_FILE
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="numpy") as f:
            info = json.loads((f.metadata() or {})[KEY])
            arrays = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, ValueError, KeyError, RecursionError) as exc:
        raise CheckpointError(f"{path}: not a first view ({type(exc).__name__}: {exc})") from None
    if not isinstance(info, dict) or info.get("format_version") != VIEW_VERSION:
        version = info.get("format_version") if isinstance(info, dict) else None
        raise CheckpointError(f"{path}: unknown format_version {version!r} (this version of scratchscope "
                              f"reads {VIEW_VERSION})")
    if info.get("weights_sha256") != weights_sha256:
        log.info("%s was read from other weights than the snapshot's: not used", path)
        return None
    if info.get("arrays_sha256") != arrays_digest(arrays, weights_sha256):
        log.warning("%s: its arrays do not hash to what it records (changed after it was written, or written "
                    "before views were hashed): not used, the model is read", path)
        return None
    weights = Path(directory) / MODEL_FILE
    if not weights.is_file() or sha256_of(weights) != weights_sha256:
        log.warning("%s: missing, or not the weights config.json records: %s is not used", weights, path)
        return None
    return arrays, info
