"""Exact patching through TransformerLens hook points (ours, a TransformerBridge): patched runs
as rows of one batch, each run's patch written by one hook at the patched layer. Every patched
run is a whole forward (the model's own forward cannot start at a layer)."""

from __future__ import annotations

from typing import Any

import torch

from probes.common import ProbeInputError, hook_names
from probes.patching.cells import write_patch

HOOKS = {"heads": "blocks.{}.attn.hook_z", "resid": "blocks.{}.hook_resid_pre",
         "attn": "blocks.{}.hook_attn_out", "mlp": "blocks.{}.hook_mlp_out"}


class HookedTrace:
    def __init__(self, tokens: torch.Tensor, acts: dict[int, torch.Tensor], logits: torch.Tensor):
        self.tokens, self.acts, self.logits = tokens, acts, logits  # [batch pos], {layer: [batch pos ...]}, [batch pos vocab]

    def act(self, what: str, layer: int) -> torch.Tensor:
        return self.acts[layer]


class HookedEngine:
    suffix = False

    def __init__(self, model: Any, what: str, n_layers: int):
        self.model, self.what, self.n_layers = model, what, n_layers
        self.names = [HOOKS[what].format(l) for l in range(n_layers)]
        missing = [n for n in self.names if n not in hook_names(model)]
        if missing:
            raise ProbeInputError(f"{type(model).__name__} has no hook point {missing[0]}: cannot patch {what}")

    def trace(self, tokens: torch.Tensor) -> HookedTrace:
        acts: dict[int, torch.Tensor] = {}

        def keep(layer: int):
            def hook(x: torch.Tensor, hook: Any) -> None:
                acts[layer] = x.detach().clone()
            return hook
        logits = self.model.run_with_hooks(tokens, fwd_hooks=[(n, keep(l)) for l, n in enumerate(self.names)])
        return HookedTrace(tokens, acts, logits)

    def patched(self, base: HookedTrace, donor: HookedTrace, what: str, layer: int, cells: list, start: int,
                last_only: bool) -> torch.Tensor:
        tokens = base.tokens.repeat(len(cells), 1)  # [cells*batch pos]

        def patch(x: torch.Tensor, hook: Any) -> torch.Tensor:
            return write_patch(x.clone(), donor.acts[layer], cells)
        logits = self.model.run_with_hooks(tokens, fwd_hooks=[(self.names[layer], patch)])
        return logits[:, -1:] if last_only else logits


def run_editing(model: Any, tokens: torch.Tensor, edits: dict[str, Any]) -> torch.Tensor:
    """The model's logits on tokens with each named hook point's activation replaced by
    edit(activation) (TransformerLens hook points: ours, a bridge)."""
    missing = [n for n in edits if n not in hook_names(model)]
    if missing:
        raise ProbeInputError(f"{type(model).__name__} has no hook point {missing[0]}")
    hooks = [(name, lambda x, hook, edit=edit: edit(x.clone())) for name, edit in edits.items()]
    return model.run_with_hooks(tokens, fwd_hooks=hooks)
