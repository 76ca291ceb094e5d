"""What one checkpoint holds, read without building its model: every format `load_checkpoint`
reads, as the config it would build (`models.info` prints the same config), its step and format.

    from models.store.peek import peek
    peek(Path("out-shakespeare-char/ckpt.pt"))
    # {"format": "nanoGPT checkpoint", "model": {"family": "transformer", "n_layers": 6, ...}, "step": 5000}

A snapshot's or Hugging Face directory's config.json is read as JSON; a nanoGPT ``.pt`` is opened
with ``torch.load(weights_only=True, mmap=True)``, so its tensors are mapped, not read (only the
tied-unembedding test touches two of them); a series ``.pt`` is described by its preset alone.
Another Hugging Face architecture (read through TransformerBridge) and a nanochat checkpoint are
described by a ForeignConfig (`models.store.foreign`): layers, heads, context, vocabulary and
parameters, from config.json (and the safetensors header) or nanochat's meta file (and the
mapped weights).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from models.store.files import CheckpointError, read_json_object
from models.store.nanochat_files import is_nanochat, nanochat_shape
from models.store.run import SNAPSHOT_CONFIG

__all__ = ["FORMATS", "holds_checkpoint", "peek"]

NANOGPT_FILE = "ckpt.pt"
FORMATS = {"snapshot": "snapshot", "hf": "Hugging Face GPT-2", "nanogpt": "nanoGPT checkpoint",
           "series": "series state dict", "bridge": "Hugging Face model", "nanochat": "nanochat checkpoint",
           "any": "snapshot of any model"}


def holds_checkpoint(path: Path) -> bool:
    """What `peek` reads: a checkpoint file, or a folder holding a config.json (ours or Hugging
    Face's) or nanoGPT's ckpt.pt."""
    return path.is_file() or (path / SNAPSHOT_CONFIG).is_file() or (path / NANOGPT_FILE).is_file()


def peek(path: str | Path, preset: str | None = None) -> dict[str, Any]:
    """{"format", "model" (our config as a dict), "step" (None where the format keeps none)}."""
    path = Path(path)
    if path.is_dir():
        if (path / SNAPSHOT_CONFIG).is_file():
            return _config_json(path)
        if not (path / NANOGPT_FILE).is_file():
            raise CheckpointError(f"{path}: no {SNAPSHOT_CONFIG} and no {NANOGPT_FILE}: not a checkpoint")
        path = path / NANOGPT_FILE
    if not path.is_file():
        raise CheckpointError(f"{path}: not found")
    if is_nanochat(path):
        return _nanochat(path)
    if preset:  # a series state dict: the preset is its config (nothing in the file says more)
        from models.presets import get_preset

        return {"format": FORMATS["series"], "model": get_preset(preset).to_dict(), "step": None}
    return _nanogpt(path)


def _config_json(directory: Path) -> dict[str, Any]:
    from models.store.hf import hf_config, is_hf_config, refuse_untyped

    data = read_json_object(directory / SNAPSHOT_CONFIG)
    refuse_untyped(data, directory / SNAPSHOT_CONFIG)
    if is_hf_config(data) and data.get("model_type") != "gpt2":  # read through TransformerBridge
        from models.store.foreign import hf_shape

        return {"format": FORMATS["bridge"], "model": hf_shape(data, directory).to_dict(), "step": _hf_step(directory)}
    if is_hf_config(data):
        return {"format": FORMATS["hf"], "model": hf_config(data, directory / SNAPSHOT_CONFIG).to_dict(),
                "step": None}
    from models.config import config_from_dict
    from models.store.any_files import any_shape, is_any_snapshot

    step, model = data.get("step"), data.get("model")
    if is_any_snapshot(data):  # the Monitor's snapshot of a model of the user's own
        return {"format": FORMATS["any"], "model": any_shape(data, directory / SNAPSHOT_CONFIG).to_dict(),
                "step": step if isinstance(step, int) and not isinstance(step, bool) else None}
    if not isinstance(model, dict):
        raise CheckpointError(f"{directory / SNAPSHOT_CONFIG}: no 'model' config")
    return {"format": FORMATS["snapshot"], "model": config_from_dict(model).to_dict(),
            "step": step if isinstance(step, int) and not isinstance(step, bool) else None}


def _hf_step(directory: Path) -> int | None:
    """The global_step of a Trainer's checkpoint-N/ (its trainer_state.json), else None."""
    state = directory / "trainer_state.json"
    try:
        step = read_json_object(state).get("global_step") if state.is_file() else None
    except CheckpointError:
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _nanogpt(path: Path) -> dict[str, Any]:
    from models.store.nanogpt import int_or_none, is_nanogpt, nanogpt_config, why_not_nanogpt

    obj = _mapped(path)
    if not is_nanogpt(obj):
        raise CheckpointError(f"{path}: not a nanoGPT checkpoint ({why_not_nanogpt(obj)}); a series .pt "
                              "needs its preset")
    return {"format": FORMATS["nanogpt"], "model": nanogpt_config(path, obj).to_dict(),
            "step": int_or_none(obj.get("iter_num"))}


def _nanochat(path: Path) -> dict[str, Any]:
    """The meta file's shape and step; the parameters counted on the mapped weights."""
    state = _mapped(path)
    count = sum(v.numel() for v in state.values() if hasattr(v, "numel")) if isinstance(state, dict) else None
    shape, step = nanochat_shape(path, count)
    return {"format": FORMATS["nanochat"], "model": shape.to_dict(), "step": step}


def _mapped(path: Path) -> Any:
    """torch.load(weights_only=True) with the tensors memory-mapped (a file torch cannot map, such
    as the legacy format, is read whole)."""
    import torch

    from models.store.weights import torch_load

    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - torch_load reads it whole, or says in one line why not
        return torch_load(path)
