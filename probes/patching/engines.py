"""Which engine patches a model: the replay of our Transformer (from the patched layer, from the
earliest patched position), else hook points (a TransformerBridge)."""

from __future__ import annotations

import logging
from typing import Any

import torch

from probes.common import ProbeInputError, hook_names
from probes.patching.hooked import EditingEngine, HookedEngine
from probes.patching.tapped import TapEngine, find_parts
from probes.patching.replay import ReplayEngine

log = logging.getLogger(__name__)

REPLAY_TOLERANCE = 1e-4  # of the logits' scale: the replay must reproduce the model's own forward


def model_dims(model: Any, ids: torch.Tensor | None = None) -> tuple[int, int, int]:
    """(n_layers, n_heads, d_vocab) of a model the probe can patch, or one line saying why not. A
    module without a cfg (any GPT) is read through the tap on ids [batch pos]."""
    cfg = getattr(model, "cfg", None)
    if cfg is None and isinstance(model, torch.nn.Module) and ids is not None:
        parts = find_parts(model, ids)
        return len(parts.attention), parts.n_heads, parts.d_vocab
    if getattr(cfg, "family", "transformer") != "transformer":
        raise ProbeInputError(f"this model ({cfg.family} family) has no attention heads to patch")
    if cfg is None or not all(hasattr(cfg, n) for n in ("n_layers", "n_heads", "d_vocab")):
        raise ProbeInputError(f"{type(model).__name__} is not one of our models or a TransformerBridge: "
                              "patching found no layers and heads to patch")
    if not int(cfg.n_heads):
        raise ProbeInputError("this model has no attention heads to patch")
    return int(cfg.n_layers), int(cfg.n_heads), int(cfg.d_vocab)


def is_ours(model: Any) -> bool:
    from models.transformer import Transformer
    return isinstance(model, Transformer)


def traced_engine(model: Any, what: str, n_layers: int, base_ids: torch.Tensor,
                  donor_ids: torch.Tensor) -> tuple[Any, Any, Any]:
    """The engine and its traces of the base and donor runs. Our Transformer is replayed when the
    replay reproduces its logits on the base run; otherwise (or any other model) hook points."""
    if is_ours(model):
        engine = ReplayEngine(model)
        base = engine.trace(base_ids)
        own = model(base_ids)  # [batch pos vocab]
        scale = float(own.abs().max())
        if float((base.logits - own).abs().max()) <= REPLAY_TOLERANCE * max(scale, 1e-30):
            return engine, base, engine.trace(donor_ids)
        log.warning("the replay of %s does not reproduce its logits: patching through its hook points",
                    type(model).__name__)
    engine = editing_engine(model, what, n_layers, base_ids)
    return engine, engine.trace(base_ids), engine.trace(donor_ids)


def editing_engine(model: Any, what: str, n_layers: int, ids: torch.Tensor) -> EditingEngine:
    """Hook points where the model has them (ours, a bridge), else the tap's way into any module
    (its parts found from one forward on ids)."""
    if hook_names(model):
        return HookedEngine(model, what, n_layers)
    return TapEngine(model, what, ids)
