"""The series' models with TransformerLens hook points, tokenizers and checkpoints.

    from models import build_model, get_preset
    model = build_model(get_preset("transformer4_rms_small"))
    logits, cache = model.run_with_cache(tokens)   # cache["blocks.0.attn.hook_pattern"]
"""

from models.config import MLPConfig, ModelConfig, TransformerConfig, config_from_dict
from models.mlp_lm import MLPLanguageModel
from models.presets import PRESETS, get_preset, list_presets
from models.transformer import Transformer

__all__ = ["MLPConfig", "MLPLanguageModel", "ModelConfig", "PRESETS", "Transformer",
           "TransformerConfig", "build_model", "config_from_dict", "get_preset", "list_presets"]


def build_model(config: ModelConfig):
    """A freshly initialised model for a config of either family."""
    if isinstance(config, TransformerConfig):
        return Transformer(config)
    if isinstance(config, MLPConfig):
        return MLPLanguageModel(config)
    raise ValueError(f"build_model needs a TransformerConfig or MLPConfig, got {type(config).__name__}")
