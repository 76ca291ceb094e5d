"""One attention source for the probes that read attention: the hook points of our models and of a
TransformerBridge (`blocks.{l}.attn.hook_pattern`), or, on any other `nn.Module` mapping
[batch pos] ids to logits, the attention tap (`models.tap`). Both hand each wanted layer's
pattern [batch head q k] to the probe's reducer inside the forward pass and end the pass after
the last wanted layer, so memory stays at one layer's attention.

`tap_dims` learns a tapped model's layers, heads and vocabulary from one forward pass on a short
window of token 0, and its context from its config (`max_position_embeddings`, `n_ctx`,
`block_size`, `sequence_len`, ...) where it names one, else from the tokens given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from models.tap import StopTap, TapError, context_of, tap_forward
from probes.errors import ProbeInputError

PROBE_LEN = 8  # tokens of the window that tap_dims reads a model's shape from


@dataclass(frozen=True)
class ModelDims:
    n_layers: int
    n_heads: int
    n_ctx: int
    d_vocab: int


def hooked(model: Any) -> bool:
    """Ours or a TransformerBridge: attention read at its hook points (else through the tap)."""
    return "blocks.0.attn.hook_pattern" in getattr(model, "hook_dict", {})


def has_lens_cfg(model: Any) -> bool:
    """A TransformerLens-style cfg (ours, a bridge's): dims come from it, not from a forward."""
    cfg = getattr(model, "cfg", None)
    return cfg is not None and hasattr(cfg, "n_ctx") and hasattr(cfg, "d_vocab")


def longest_row(tokens: Any) -> int | None:
    """The longest row of [batch pos] tokens or of a list of such batches; None if unknown."""
    if isinstance(tokens, torch.Tensor):
        return int(tokens.shape[-1]) if tokens.dim() else None
    if isinstance(tokens, (list, tuple)) and tokens and all(isinstance(t, torch.Tensor) for t in tokens):
        return max(int(t.shape[-1]) for t in tokens if t.dim())
    return None


def model_device(model: Any) -> torch.device:
    """The device of the model's first parameter (the CPU for a model without any)."""
    param = next(iter(model.parameters()), None)
    return param.device if param is not None else torch.device("cpu")


def tap_dims(model: Any, tokens: Any = None) -> ModelDims:
    """Layers, heads (the most of any layer) and vocabulary of a tapped model from one forward on
    a short window; the context from its config, else the tokens' longest row."""
    context, given = context_of(model), longest_row(tokens)
    n = min(PROBE_LEN, context or given or PROBE_LEN, given or PROBE_LEN)
    ids = torch.zeros(1, max(n, 1), dtype=torch.long, device=model_device(model))
    try:
        result = tap_forward(model, ids, lambda call: None)
    except TapError as err:
        raise ProbeInputError(str(err)) from None
    if len(set(result.n_heads)) > 1:
        raise ProbeInputError(f"{type(model).__name__}'s attention layers have {result.n_heads} heads: the "
                              "probes read models whose layers have the same number of heads")
    return ModelDims(len(result.layers), result.n_heads[0], context or given or ids.shape[1],
                     int(result.logits.shape[-1]))


def each_layer_pattern(model: Any, batch: torch.Tensor, layers: Sequence[int],
                       reduce: Callable[[int, torch.Tensor], None]) -> int:
    """One no-grad forward of `model` on [batch pos]: `reduce(layer, pattern [batch head q k])` for
    each of `layers`, in order, from its hook points or the tap; the pass ends after the last
    wanted layer. Returns how many layers were reduced."""
    wanted, last = set(layers), max(layers)
    done = [0]

    def take(layer: int, pattern: torch.Tensor) -> None:
        if layer in wanted:
            reduce(layer, pattern)
            done[0] += 1
        if layer == last:
            raise StopTap

    if hooked(model):
        hooks = [(f"blocks.{l}.attn.hook_pattern", lambda p, hook, l=l: take(l, p.detach())) for l in wanted]
        try:
            with torch.no_grad():
                model.run_with_hooks(batch, fwd_hooks=hooks)
        except StopTap:
            pass
    else:
        try:
            tap_forward(model, batch, lambda call: take(call.layer, call.pattern))
        except TapError as err:
            raise ProbeInputError(str(err)) from None
    return done[0]
