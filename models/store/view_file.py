"""`first_view.safetensors` beside a snapshot: what its pages show first (`probes.first_view` says
what and packs it), written and read without torch.

The file holds named numpy arrays and, in its metadata under "first_view", one JSON object:
``format_version``, ``weights_sha256`` (config.json's sha256 of the weights the view was read
from: a view of other weights is stale and never read), ``tokens`` (the [pos] ids the view read),
``text`` (the text they encode; null for a saved sample's row), ``skipped`` (part -> why it was
not read), ``parts`` (the skeleton `probes.first_view.unpack` reads the arrays with: verdicts,
where each grid lies in the arrays) and ``view_sha256``: the whole view hashed, the arrays and all
of this JSON with the weights' sha256 in it. A view changed after it was written (a head's verdict,
a grid's offset, its tokens) is never drawn as the model's; one of format version 1 (which hashed
its arrays only) is not read either (logged): the model is. It is optional: a snapshot without one (or with a stale one) is read from its model. It is read only while
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

__all__ = ["VIEW_FILE", "VIEW_VERSION", "read_view", "view_digest", "write_view"]

VIEW_FILE = "first_view.safetensors"
VIEW_VERSION = 2  # 1 hashed the arrays only
KEY = "first_view"

log = logging.getLogger(__name__)


def write_view(directory: str | Path, arrays: dict[str, np.ndarray], info: dict[str, Any]) -> Path:
    """Write the view atomically into the snapshot `directory`; `info` holds all but format_version."""
    from safetensors.numpy import save

    meta = json.loads(dumps_json({"format_version": VIEW_VERSION, **info}))  # as read back: the hash's input
    meta["view_sha256"] = view_digest(arrays, meta)
    data = save({name: np.ascontiguousarray(a) for name, a in arrays.items()},
                metadata={KEY: dumps_json(meta, separators=(",", ":"))})
    return write_bytes_atomic(Path(directory) / VIEW_FILE, data)


def view_digest(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> str:
    """sha256 of the view's JSON (its skeleton, tokens, text, skipped parts and the weights' sha256;
    keys sorted, without view_sha256) and each array's name, dtype, shape and bytes, in name order."""
    skeleton = {k: v for k, v in meta.items() if k != "view_sha256"}
    digest = hashlib.sha256(json.dumps(skeleton, sort_keys=True, separators=(",", ":")).encode("utf-8"))
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
    version = info.get("format_version") if isinstance(info, dict) else None
    if version == 1:
        log.info("%s was written by an older scratchscope (its JSON not hashed): not used, the model is read", path)
        return None
    if version != VIEW_VERSION:
        raise CheckpointError(f"{path}: unknown format_version {version!r} (this version of scratchscope "
                              f"reads {VIEW_VERSION})")
    if info.get("weights_sha256") != weights_sha256:
        log.info("%s was read from other weights than the snapshot's: not used", path)
        return None
    try:
        whole = info.get("view_sha256") == view_digest(arrays, info)
    except (RecursionError, TypeError, ValueError):  # JSON nested too deep to write back, or other damage
        whole = False
    if not whole:
        log.warning("%s: it does not hash to what it records (changed after it was written): not used, the model "
                    "is read", path)
        return None
    weights = Path(directory) / MODEL_FILE
    if not weights.is_file() or sha256_of(weights) != weights_sha256:
        log.warning("%s: missing, or not the weights config.json records: %s is not used", weights, path)
        return None
    return arrays, info
