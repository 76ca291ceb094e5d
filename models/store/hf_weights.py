"""What a Hugging Face directory's safetensors files hold, read from their JSON headers before
transformers loads anything (torch-free): the tensors' names and dtypes, from ``model.safetensors``
or from the shards ``model.safetensors.index.json`` names. transformers casts integer tensors to
the float dtype it is asked for without a word (int32 weights, almost all zero, loaded as a model),
so a tensor that is not floating point is refused here, named.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

from models.store.files import CheckpointError, read_json_object

__all__ = ["check_float_weights", "safetensors_dtypes", "safetensors_header"]

INDEX = "model.safetensors.index.json"
FLOATS = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}
MAX_HEADER = 100 * 2**20


def safetensors_dtypes(path: Path) -> dict[str, str]:
    """name -> dtype ("F32", "I32", ...) of every tensor in the .safetensors file `path`."""
    return {name: str(entry.get("dtype")) for name, entry in safetensors_header(path).items()}


def safetensors_header(path: Path) -> dict[str, dict]:
    """name -> {dtype, shape, data_offsets} of every tensor in the .safetensors file `path`, from its
    header alone (8-byte little-endian length, then JSON); CheckpointError naming the file."""
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > MAX_HEADER:
                raise CheckpointError(f"{path}: not a safetensors file (a header of {length} bytes)")
            header = json.loads(f.read(length))
    except (OSError, struct.error, ValueError, RecursionError) as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"{path}: not a readable safetensors file ({str(exc).splitlines()[0][:120]})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: not a safetensors file (its header is not a JSON object)")
    return {name: entry for name, entry in header.items() if name != "__metadata__" and isinstance(entry, dict)}


def weight_files(directory: Path) -> list[Path]:
    """The directory's safetensors files: model.safetensors, else the shards its index names
    (the index checked: a garbled one is named, not left to transformers)."""
    single = directory / "model.safetensors"
    index = directory / INDEX
    if single.is_file() or not index.is_file():
        return [single] if single.is_file() else []
    weight_map = read_json_object(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map or \
            not all(isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        raise CheckpointError(f"{index}: no 'weight_map' of tensor names to shard files (save_pretrained "
                              "writes one beside the shards)")
    shards = sorted(set(weight_map.values()))
    missing = [s for s in shards if Path(s).name != s or not (directory / s).is_file()]
    if missing:
        raise CheckpointError(f"{index}: names shard {missing[0]!r}, which is not a file in {directory}")
    return [directory / s for s in shards]


def check_float_weights(directory: Path) -> None:
    """Every tensor in the directory's safetensors files is floating point: else one line naming them."""
    for path in weight_files(directory):
        dtypes = safetensors_dtypes(path)
        odd = [f"{name} ({dtype})" for name, dtype in dtypes.items() if dtype not in FLOATS]
        if odd:
            shown = ", ".join(odd[:3]) + (", ..." if len(odd) > 3 else "")
            raise CheckpointError(f"{path}: {len(odd)} of {len(dtypes)} tensors are not floating point ({shown}): "
                                  "a model's weights are; the file was rewritten or is not a model's")


SIZE_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "n_embd", "n_inner", "d_model", "ffn_dim")
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")


def check_declared_sizes(directory: Path, config: dict) -> None:
    """A config.json declaring far more than its safetensors weights hold (a vocabulary or a width
    larger than any dimension of them, twice the layers their names number) is refused before
    transformers builds it: it allocates the declared model first. Read from the headers alone."""
    shapes = {name: entry.get("shape") for path in weight_files(directory)
              for name, entry in safetensors_header(path).items()}
    if not shapes:  # pytorch_model.bin: transformers reads it
        return
    largest = max((d for shape in shapes.values() if isinstance(shape, list) for d in shape if isinstance(d, int)),
                  default=0)
    source = directory / "config.json"
    for key in SIZE_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > largest:
            raise CheckpointError(f"{source}: {key} {value} is larger than any dimension of its weights "
                                  f"(the largest is {largest}): not built")
    numbered = [int(n) for name in shapes for n in re.findall(r"\.(\d+)\.", name)]
    layers = next((config[k] for k in LAYER_KEYS if isinstance(config.get(k), int)), None)
    if numbered and layers is not None and layers > 2 * (max(numbered) + 1):  # a few more: transformers names them
        raise CheckpointError(f"{source}: {layers} layers declared, but its weights number blocks up to "
                              f"{max(numbered)}: not built")
