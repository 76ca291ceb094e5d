"""Series ``.pt`` state dicts: the ``--ckpt model.pt --preset NAME`` (or ``--config``) path.

The file is read with ``torch.load(weights_only=True)``; a checkpoint dict's ``"model"`` or
``"state_dict"`` entry and ``torch.compile``/DDP name prefixes are unwrapped, and the weights are
loaded strictly into ``build_model(config)``. The series' single-block AttnNet names are mapped
to ours by the Transformer's own load hook (:func:`models.transformer.series_key`). A
``vocab.json`` beside the file becomes the tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from models import get_preset
from models.config import ModelConfig
from models.store.files import CheckpointError, refuse_unknown_fields
from models.store.front import SNAPSHOT_KEYS, parse_config
from models.store.result import Snapshot
from models.store.weights import build_and_load, strip_prefixes, torch_load
from models.tokenizers import CharTokenizer, Tokenizer, TokenizerError

__all__ = ["SERIES_SUFFIXES", "VOCAB_FILE", "load_series_checkpoint", "load_series_state_dict"]

VOCAB_FILE = "vocab.json"
SERIES_SUFFIXES = (".pt", ".pth", ".bin")  # what --ckpt treats as a series state dict


def _unwrap_state_dict(obj: Any, path: Path) -> dict[str, Any]:
    """A plain state dict, or the one under "model"/"state_dict"; strips compile/DDP prefixes."""
    if isinstance(obj, dict):
        for key in ("model", "state_dict"):
            if isinstance(obj.get(key), dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not obj:
        raise CheckpointError(f"{path}: expected a state dict (name -> tensor), or a dict with a "
                              f"'model' or 'state_dict' entry; got {type(obj).__name__}")
    return strip_prefixes(obj)


def load_series_state_dict(path: str | Path, config: ModelConfig, tokenizer: Tokenizer | None = None,
                           device: str | torch.device = "cpu", *, loaded: Any = None) -> Snapshot:
    """Load a series ``.pt`` state dict into ``build_model(config)`` (strict); vocab.json beside it
    becomes the tokenizer unless one is given. `loaded`: the file's object when the caller has
    already read it (``load_checkpoint`` does, to detect the format)."""
    path = Path(path)
    if loaded is None and not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    state = _unwrap_state_dict(torch_load(path) if loaded is None else loaded, path)
    if tokenizer is None and (path.parent / VOCAB_FILE).is_file():
        try:
            tokenizer = CharTokenizer.load(path.parent)
        except TokenizerError as exc:
            raise CheckpointError(f"{path.parent / VOCAB_FILE}: {exc}") from None
    if tokenizer is not None and tokenizer.vocab_size > config.d_vocab:
        raise CheckpointError(f"{path}: tokenizer has {tokenizer.vocab_size} tokens but the config's "
                              f"d_vocab is {config.d_vocab}")
    model = build_and_load(config, state, path, exact_names=False)  # shapes checked on meta first
    meta = {"format_version": None, "source": "series_pt", "model": config.to_dict(),
            "tokenizer": None if tokenizer is None else
            {"kind": tokenizer.kind, "files": list(tokenizer.files)},
            "step": None, "tokens_seen": None, "train_config": None}
    return Snapshot(model.to(device).eval(), tokenizer, config, meta, path)


def load_series_checkpoint(path: Path, *, preset: str | None, config: str | Path | None,
                           device: str | torch.device = "cpu", loaded: Any = None) -> Snapshot:
    """A series ``.pt`` with ``config`` (a JSON config file) or else ``preset`` (a preset name)."""
    return load_series_state_dict(path, _series_config(path, preset, config), device=device,
                                  loaded=loaded)


def _series_config(path: Path, preset: str | None, config: str | Path | None) -> ModelConfig:
    """The config file's model config, or the preset with d_vocab from vocab.json beside ``path``."""
    if config is not None:
        return _config_file(Path(config))
    if preset is None:
        raise CheckpointError(f"{path}: a series .pt needs --preset or --config")
    overrides = {}
    if (path.parent / VOCAB_FILE).is_file():
        try:
            overrides["d_vocab"] = CharTokenizer.load(path.parent).vocab_size
        except TokenizerError as exc:
            raise CheckpointError(f"{path.parent / VOCAB_FILE}: {exc}") from None
    try:
        return get_preset(preset, **overrides)
    except ValueError as exc:
        raise CheckpointError(f"{path}: {exc}") from None


def _config_file(path: Path) -> ModelConfig:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: config file not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    except RecursionError:
        raise CheckpointError(f"{path}: not valid JSON (nested too deep)") from None
    if isinstance(data, dict) and isinstance(data.get("model"), dict):  # a snapshot's config.json works too
        refuse_unknown_fields(data, SNAPSHOT_KEYS, path, "top-level")
        data = data["model"]
    return parse_config(data, path)
