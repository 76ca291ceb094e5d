"""What a snapshot of any model's files must agree on before anything reads them (torch-free):
config.json's shape and layout, the readings' shapes against that shape and against each other,
and the weights against the layout. Each problem is one CheckpointError naming the file and the
field: a pattern 10x10 for 20 positions, zero heads, a NaN width, a vocabulary of "40", a table of
int8 or a tensor named "" would otherwise surface as an einsum error, a ZeroDivisionError, an
OverflowError or, worse, as numbers drawn without a word.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from models.store.files import CheckpointError

__all__ = ["check_layout", "check_model_shape", "check_readings", "check_weights"]

MAX_DIM = 2**31  # no dimension of a model we read is larger (a vocabulary of 3e8 is not a model here)
POSITIVE = ("n_ctx", "d_vocab")
COUNTS = ("n_layers", "n_heads", "n_kv_heads", "d_model")  # positive in a transformer; 0 allowed in another family
NAMES = ("token_embedding", "position_embedding", "final_norm", "unembedding")  # str or null
LENS_CUT = {"kl": 0, "finite": 0, "cross_entropy": 1, "rank": 1, "top_probs": 0, "top_ids": 0}  # positions - cut


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def is_count(value: Any, least: int = 1) -> bool:
    """An int (not a bool) from `least` up to MAX_DIM."""
    return isinstance(value, int) and not isinstance(value, bool) and least <= value <= MAX_DIM


def check_model_shape(model: Any, path: Path) -> None:
    """config.json's 'model': positive integer dims, text names."""
    if not isinstance(model, dict):
        raise CheckpointError(f"{path}: 'model' must be an object (the model's shape), got {short(model)}")
    attention = model.get("family", "transformer") == "transformer"  # the pages divide by its heads
    for key in POSITIVE + COUNTS:
        if not is_count(model.get(key), 1 if key in POSITIVE or attention else 0):
            raise CheckpointError(f"{path}: 'model.{key}' must be a {'positive' if key in POSITIVE or attention else 'whole'} "
                                  f"number (at most 2**31), got {short(model.get(key))}")
    n_params = model.get("n_params")
    if n_params is not None and not (isinstance(n_params, int) and not isinstance(n_params, bool) and n_params >= 0):
        raise CheckpointError(f"{path}: 'model.n_params' must be a count or null, got {short(n_params)}")
    for key in ("architecture", "unembed", "family"):
        if key in model and not isinstance(model[key], str):
            raise CheckpointError(f"{path}: 'model.{key}' must be text, got {short(model[key])}")


def check_layout(layout: dict[str, Any], path: Path) -> None:
    """config.json's 'layout': names as text (or null), flags as booleans, 'missing' part -> why."""
    for key in NAMES:
        if layout.get(key) is not None and not (isinstance(layout[key], str) and layout[key]):
            raise CheckpointError(f"{path}: 'layout.{key}' must be a name or null, got {short(layout[key])}")
    for key in ("unembedding_bias", "tied"):
        if not isinstance(layout.get(key, False), bool):
            raise CheckpointError(f"{path}: 'layout.{key}' must be true or false, got {short(layout[key])}")
    if layout.get("d_vocab") is not None and not is_count(layout["d_vocab"]):
        raise CheckpointError(f"{path}: 'layout.d_vocab' must be a positive integer or null, "
                              f"got {short(layout['d_vocab'])}")
    missing = layout.get("missing", {})
    if not isinstance(missing, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in missing.items()):
        raise CheckpointError(f"{path}: 'layout.missing' must map parts to why they were not found, got {short(missing)}")


def check_weights(tensors: dict[str, Any], layout: dict[str, Any], d_vocab: int, path: Path) -> None:
    """model.safetensors against the layout: no tensor named "", and the tables the layout names
    there, two-dimensional and floating point, the token table with a row per token."""
    if "" in tensors:
        raise CheckpointError(f"{path}: a tensor named \"\" (no module holds it)")
    tables = {"token_embedding": layout.get("token_embedding"), "position_embedding": layout.get("position_embedding"),
              "unembedding": f"{layout['unembedding']}.weight" if layout.get("unembedding") else None}
    for part, name in tables.items():
        if name is None:
            continue
        tensor = tensors.get(name)
        if tensor is None:
            raise CheckpointError(f"{path}: no tensor {name!r}, which config.json's layout names as the {part}")
        if len(tensor.shape) != 2 or not tensor.dtype.is_floating_point:
            raise CheckpointError(f"{path}: {name!r} (the {part}) must be a 2-D floating-point table, "
                                  f"got {tuple(tensor.shape)} {tensor.dtype}")
        if part != "position_embedding" and tensor.shape[0] < d_vocab:
            raise CheckpointError(f"{path}: {name!r} (the {part}) has {tensor.shape[0]} rows for the "
                                  f"model's {d_vocab} tokens")


def check_readings(arrays: dict[str, np.ndarray], meta: dict[str, Any], path: Path) -> None:
    """readings.safetensors against config.json: the sample's tokens are ids of the vocabulary,
    each pattern is [rows heads pos pos] of its tokens, the lens [points rows pos ...]."""
    d_vocab, n_heads, n_layers = (meta["model"][k] for k in ("d_vocab", "n_heads", "n_layers"))
    if "sample.tokens" not in arrays:
        raise CheckpointError(f"{path}: no 'sample.tokens'")
    for kind in ("sample", "repeat"):
        tokens = arrays.get(f"{kind}.tokens")
        if tokens is None:
            continue
        _ids(tokens, f"{kind}.tokens", d_vocab, path, dims=2)
        rows, pos = tokens.shape
        for name in sorted((n for n in arrays if n.startswith(f"{kind}.pattern.")), key=_layer_order):
            layer = name.rsplit(".", 1)[1]
            if not (layer.isdigit() and int(layer) < n_layers):
                raise CheckpointError(f"{path}: '{name}' names no layer of the model's {n_layers}")
            heads = n_heads or (arrays[name].shape[1] if arrays[name].ndim == 4 and arrays[name].shape[1] else -1)
            _float(arrays[name], name, (rows, heads, pos, pos), path)
    counts = {a.shape[1] for n, a in arrays.items() if n.startswith("sample.pattern.")}
    if n_heads == 0 and len(counts) == 1:  # 0: heads varying per layer, which these do not
        raise CheckpointError(f"{path}: config.json's 'model.n_heads' is 0 but every layer's pattern has "
                              f"{counts.pop()} heads")
    lens = meta["readings"].get("lens")
    if isinstance(lens, dict):
        _check_lens(arrays, lens, meta["readings"].get("lens_k"), d_vocab, arrays["sample.tokens"].shape, path)


def _layer_order(name: str) -> tuple[int, str]:
    layer = name.rsplit(".", 1)[1]
    return (int(layer) if layer.isdigit() else -1, name)


def _check_lens(arrays: dict[str, np.ndarray], lens: dict[str, Any], k: Any, d_vocab: int,
                sample: tuple[int, ...], path: Path) -> None:
    points = lens.get("points")
    if not isinstance(points, list) or not points or not is_count(k):
        raise CheckpointError(f"{path}: config.json's 'readings.lens' must list its points and 'lens_k' its top k")
    rows, pos = sample
    for field, cut in LENS_CUT.items():
        name = f"lens.{field}"
        if name not in arrays:
            raise CheckpointError(f"{path}: no '{name}', though config.json says the lens was saved")
        shape = (len(points), rows, pos - cut) + ((min(k, d_vocab),) if field.startswith("top_") else ())
        if field in ("top_ids", "finite"):  # [point rows pos k] ids, [point rows pos] 0/1
            _ids(arrays[name], name, d_vocab if field == "top_ids" else 2, path, shape=shape)
        else:
            _float(arrays[name], name, shape, path)
    probs = arrays["lens.top_probs"]
    if np.any((probs < 0) | (probs > 1)):  # NaN (a diverged model's lens) compares False: kept
        raise CheckpointError(f"{path}: 'lens.top_probs' holds {float(probs[(probs < 0) | (probs > 1)][0])}, "
                              "not a probability")


def _float(array: np.ndarray, name: str, shape: tuple[int, ...], path: Path) -> None:
    if array.shape != shape or array.dtype.kind != "f":
        raise CheckpointError(f"{path}: '{name}' is {list(array.shape)} {array.dtype}, expected {list(shape)} floats")


def _ids(array: np.ndarray, name: str, d_vocab: int | None, path: Path, dims: int | None = None,
         shape: tuple[int, ...] | None = None) -> None:
    if array.dtype.kind not in "iu" or (dims is not None and array.ndim != dims) or \
            (shape is not None and array.shape != shape) or 0 in array.shape:
        raise CheckpointError(f"{path}: '{name}' is {list(array.shape)} {array.dtype}, expected "
                              f"{list(shape) if shape else f'{dims}-D'} integers")
    if d_vocab is not None and array.size and (array.min() < 0 or array.max() >= d_vocab):
        bad = int(array.min()) if array.min() < 0 else int(array.max())
        raise CheckpointError(f"{path}: '{name}' holds the id {bad}, outside the model's {d_vocab} tokens")

