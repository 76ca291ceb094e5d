"""The series' models with TransformerLens hook points, tokenizers and checkpoints.

    from models import build_model, get_preset
    model = build_model(get_preset("transformer4_rms_small"))
    logits, cache = model.run_with_cache(tokens)   # cache["blocks.0.attn.hook_pattern"]

The model classes load on first use (PEP 562), so that `python -m models.info --help` and the
other CLIs answer before torch is imported; configs and presets are torch-free.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from models.config import MLPConfig, ModelConfig, TransformerConfig, config_from_dict
from models.presets import PRESETS, get_preset, list_presets

if TYPE_CHECKING:
    from models.mlp_lm import MLPLanguageModel
    from models.transformer import Transformer

__all__ = ["MLPConfig", "MLPLanguageModel", "ModelConfig", "PRESETS", "Transformer",
           "TransformerConfig", "build_model", "config_from_dict", "get_preset", "list_presets"]
_LAZY = {"MLPLanguageModel": "models.mlp_lm", "Transformer": "models.transformer"}  # need torch


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later look-ups skip this function
        return value
    raise AttributeError(f"module 'models' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def build_model(config: ModelConfig):
    """A freshly initialised model for a config of either family."""
    if isinstance(config, TransformerConfig):
        from models.transformer import Transformer
        return Transformer(config)
    if isinstance(config, MLPConfig):
        from models.mlp_lm import MLPLanguageModel
        return MLPLanguageModel(config)
    raise ValueError(f"build_model needs a TransformerConfig or MLPConfig, got {type(config).__name__}")
