"""Attention read at hook points: our models and a TransformerBridge (`blocks.{l}.attn.hook_pattern`
[batch head q k]). Dims from the model's cfg; sliding windows from the Hugging Face config a
bridge wraps (`config_windows`), none for ours.

`config_windows(config, n_layers)` reads what transformers' own configs say: `layer_types` (every
config of transformers 5: "sliding_attention" layers take `sliding_window`; Gemma 2/3's
alternation, Qwen2's `use_sliding_window` / `max_window_layers` are already spelled out there),
else `sliding_window` on every layer (Mistral), unless `use_sliding_window` is False; older
Gemma 3 configs give `sliding_window_pattern` (every n-th layer global) instead of `layer_types`.
Transformers masks key j from row i when j <= i - w: k_i = min(i + 1, w).
"""

from __future__ import annotations

from typing import Any, ContextManager, Iterable

import torch

from models.tap import StopTap
from probes.common import eval_mode
from probes.errors import ProbeInputError
from probes.sources.attention import AttentionSource, ModelDims, Reduce, checked_device, hooked, stop_after


def config_windows(config: Any, n_layers: int) -> dict[int, int]:
    """layer -> sliding window from a Hugging Face config (empty where it names none)."""
    window = getattr(config, "sliding_window", None)
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        return {}
    if getattr(config, "use_sliding_window", True) is False:
        return {}
    types = getattr(config, "layer_types", None)
    if isinstance(types, (list, tuple)) and len(types) == n_layers:
        return {l: window for l, kind in enumerate(types) if kind == "sliding_attention"}
    every = getattr(config, "sliding_window_pattern", None)
    if isinstance(every, int) and every > 1:  # Gemma 3 before layer_types: every n-th layer global
        return {l: window for l in range(n_layers) if (l + 1) % every}
    return {l: window for l in range(n_layers)}


def wrapped_config(model: Any) -> Any:
    """The Hugging Face config of the model a TransformerBridge wraps (None for ours)."""
    return getattr(getattr(model, "original_model", None), "config", None)


class HookedSource(AttentionSource):
    """Ours or a TransformerBridge: the model's cfg gives its dims; patterns from hook_pattern."""

    kind = "hooks"

    def __init__(self, model: Any):
        cfg = model.cfg
        n_layers, n_heads = int(getattr(cfg, "n_layers", 0) or 0), int(getattr(cfg, "n_heads", 0) or 0)
        if n_layers < 1 or n_heads < 1 or not hooked(model):
            raise ProbeInputError(f"{type(model).__name__} has no attention layers to probe "
                                  f"(an MLP-family model has no attention heads)")
        self.model, self.name = model, type(model).__name__
        self.device = checked_device(model)
        self.dims = ModelDims(n_layers, n_heads, int(cfg.n_ctx), int(cfg.d_vocab))
        self.windows = config_windows(wrapped_config(model), n_layers)

    def reading(self) -> ContextManager[Any]:
        return eval_mode(self.model)

    def each_layer_pattern(self, batch: torch.Tensor, layers: Iterable[int], reduce: Reduce) -> int:
        layers = list(layers)
        take, done = stop_after(layers, reduce)

        def hook_for(layer: int):
            def hook(pattern: torch.Tensor, hook: Any) -> None:  # [batch head q k]
                if take(layer, pattern.detach()):
                    raise StopTap
            return hook

        hooks = [(f"blocks.{l}.attn.hook_pattern", hook_for(l)) for l in set(layers)]
        try:
            with torch.no_grad():
                self.model.run_with_hooks(batch, fwd_hooks=hooks)
        except StopTap:
            pass
        return done[0]
