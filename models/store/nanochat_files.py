"""Which files are nanochat's checkpoint, and the shape its meta file records: torch-free, for
``load_checkpoint``'s detection, ``peek`` and the app's run list (:mod:`.nanochat` builds it).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from models.store.files import CheckpointError, read_json_object
from models.store.foreign import ForeignConfig

__all__ = ["is_nanochat", "meta_file", "nanochat_shape"]

logger = logging.getLogger(__name__)

MAX_CONTEXT = 2**17  # positions a meta file may declare (nanochat's d20: 2048)
_MODEL_RE = re.compile(r"^model_(\d+)\.pt$")
_SAID: set[str] = set()  # meta files whose step disagrees with their model file's name, said once


def meta_file(path: Path) -> Path | None:
    """``meta_NNNNNN.json`` for nanochat's ``model_NNNNNN.pt`` (None for any other name)."""
    match = _MODEL_RE.match(path.name)
    return path.with_name(f"meta_{match.group(1)}.json") if match else None


def is_nanochat(path: Path) -> bool:
    """A ``model_NNNNNN.pt`` with its ``meta_NNNNNN.json`` beside it."""
    meta = meta_file(path)
    return meta is not None and meta.is_file()


def nanochat_shape(path: Path, n_params: int | None = None) -> tuple[ForeignConfig, int | None]:
    """(the shape the meta file of model file `path` records, the step its name says); torch-free."""
    meta_path = meta_file(path)
    meta = read_json_object(meta_path)
    kwargs = meta.get("model_config")
    if not isinstance(kwargs, dict):
        raise CheckpointError(f"{meta_path}: no 'model_config' (nanochat writes the GPTConfig's fields there)")
    ints = {}
    for name in ("n_layer", "n_head", "n_embd", "sequence_len", "vocab_size"):
        value = kwargs.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(f"{meta_path}: model_config[{name!r}] must be a positive integer, got {value!r}")
        ints[name] = value
    kv = kwargs.get("n_kv_head", ints["n_head"])
    kv = kv if isinstance(kv, int) and not isinstance(kv, bool) and kv > 0 else ints["n_head"]
    if ints["n_embd"] % ints["n_head"] or ints["n_head"] % kv:  # nanochat's GPT asserts both
        raise CheckpointError(f"{meta_path}: model_config's n_embd {ints['n_embd']}, n_head {ints['n_head']} and "
                              f"n_kv_head {kv} do not divide (n_embd by n_head, n_head by n_kv_head)")
    if ints["sequence_len"] > MAX_CONTEXT:  # nanochat's rotary tables are made for 10x the context
        raise CheckpointError(f"{meta_path}: model_config's sequence_len {ints['sequence_len']} is past "
                              f"{MAX_CONTEXT}")
    step = int(_MODEL_RE.match(path.name).group(1))  # the file's name: what nanochat loads by
    if meta.get("step") not in (None, step) and str(meta_path) not in _SAID:
        _SAID.add(str(meta_path))
        logger.warning("%s: its meta file says step %r; %s's name, step %d, is taken", meta_path,
                       meta.get("step"), path.name, step)
    shape = ForeignConfig(architecture="nanochat", n_layers=ints["n_layer"], n_heads=ints["n_head"],
                          n_kv_heads=kv,
                          d_model=ints["n_embd"], n_ctx=ints["sequence_len"], d_vocab=ints["vocab_size"],
                          n_params=n_params)
    return shape, step
