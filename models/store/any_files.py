"""A snapshot of any model: the files, read without torch (the app's first chart, `peek`).

What the Monitor's `save_every` writes for a model the store cannot rebuild as ours (a GPT a user
wrote, nanochat's, a Hugging Face Llama), in a run's ``step_NNNNNN/``:

- ``config.json``: ``"format": "any-model"``, ``format_version``, ``model`` (its shape: a
  ForeignConfig whose ``architecture`` is the class name), ``class`` (its module and class, as
  text: never imported from here), ``layout`` (`models.layout.Layout`: which tensors are the token
  and position embeddings, the blocks, the final norm, the unembedding, and one line for each part
  not found), ``buffers`` (the state-dict names that are buffers), ``model_args`` (what the user
  gave the Monitor to rebuild it with, or null), ``tokenizer``, ``step``, ``tokens_seen``, the
  sha256 of both tensor files, ``readings`` (what the readings file holds: see below), ``created``;
- ``model.safetensors``: the module's own state dict, under its own names;
- ``readings.safetensors``: what the probes read from the model at save time, on a fixed sample of
  the eval tokens (float32 unless said): ``sample.tokens`` [batch pos] (int64) and
  ``sample.pattern.L`` [batch head q k] per attention layer L; ``repeat.tokens`` [samples 2*length]
  (random tokens repeated twice, `probes.common.random_repeat_tokens` with seed 0) and
  ``repeat.pattern.L`` (and ``sample.loss``, ``repeat.loss`` [batch pos-1], each next token's loss, where the
  model's output gives logits at every position); the logit lens on the sample, one row per point (embed, 0_post, ...):
  ``lens.kl`` [point batch pos], ``lens.cross_entropy`` and ``lens.rank`` [point batch pos-1],
  ``lens.top_probs`` and ``lens.top_ids`` (int64) [point batch pos k], ``lens.finite`` (uint8)
  [point batch pos];
- the tokenizer's file(s).

`read_readings(directory)` gives the readings as numpy arrays (``safetensors.numpy``), apart from
the weights: the pages draw from them before any model loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from models.store.any_checks import check_layout, check_model_shape, check_readings
from models.store.files import CheckpointError, check_snapshot_meta, read_json_object
from models.store.foreign import ForeignConfig

__all__ = ["ANY_FORMAT", "ANY_KEYS", "ANY_VERSION", "READINGS_FILE", "any_shape", "is_any_snapshot",
           "read_any_meta", "read_readings"]

ANY_FORMAT = "any-model"
ANY_VERSION = 1
CONFIG_FILE = "config.json"
READINGS_FILE = "readings.safetensors"
REQUIRED = ("format", "format_version", "model", "class", "layout", "buffers", "tokenizer", "step", "tokens_seen",
            "tensors_sha256", "readings")
ANY_KEYS = REQUIRED + ("model_args", "train_config", "created")


def is_any_snapshot(meta: dict[str, Any]) -> bool:
    """A snapshot directory's config.json (parsed) that says it is a snapshot of any model."""
    return meta.get("format") == ANY_FORMAT


def read_any_meta(directory: Path, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """config.json of a snapshot of any model, checked: its keys, version, step and layout."""
    path = directory / CONFIG_FILE
    meta = read_json_object(path) if meta is None else meta
    check_snapshot_meta(meta, path, REQUIRED, ANY_KEYS, ANY_VERSION, " of a snapshot of any model")
    for key in ("layout", "readings"):
        if not isinstance(meta[key], dict):
            raise CheckpointError(f"{path}: '{key}' must be an object, got {type(meta[key]).__name__}")
    blocks = meta["layout"].get("blocks")
    if not isinstance(blocks, list) or not all(isinstance(b, str) for b in blocks):
        raise CheckpointError(f"{path}: 'layout.blocks' must be a list of module names, got {blocks!r}")
    if not isinstance(meta["buffers"], list):
        raise CheckpointError(f"{path}: 'buffers' must be a list of names, got {meta['buffers']!r}")
    check_layout(meta["layout"], path)
    any_shape(meta, path)
    return meta


def any_shape(meta: dict[str, Any], path: Path | None = None) -> ForeignConfig:
    """The model's shape config.json records."""
    model = meta.get("model")
    check_model_shape(model, path or Path(CONFIG_FILE))
    try:
        return ForeignConfig(**model)
    except TypeError as err:
        raise CheckpointError(f"{path or CONFIG_FILE}: 'model' is not a model shape ({err})") from None


def read_readings(directory: Path, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """The readings saved at the snapshot's step: name -> numpy array, sha256-checked against
    config.json; torch is not imported."""
    import hashlib

    from safetensors import SafetensorError
    from safetensors.numpy import load

    meta = read_any_meta(directory) if meta is None else meta
    path = directory / READINGS_FILE
    if not path.is_file():
        raise CheckpointError(f"{path}: missing; the snapshot has no readings")
    data = path.read_bytes()
    recorded = meta["readings"].get("sha256")
    if hashlib.sha256(data).hexdigest() != recorded:
        raise CheckpointError(f"{path}: sha256 mismatch with {CONFIG_FILE} (the file was modified or corrupted)")
    try:
        arrays = load(data)
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: truncated or corrupt safetensors file ({exc})") from None
    check_readings(arrays, meta, path)
    return arrays
