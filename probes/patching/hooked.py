"""Exact patching through TransformerLens hook points (ours, a TransformerBridge): patched runs
as rows of one batch, each run's patch written by one hook at the patched layer. Every patched
run is a whole forward (the model's own forward cannot start at a layer).

Every engine that reads a model from outside (this one, `probes.patching.tapped`) has one way in,
`run(tokens, edits)`: the logits with layer l's activation x replaced by edits[l](x), the
activation in the probe's layout ([batch pos head d_head] for heads, [batch pos d_model] else).
Tracing, patching, attribution's gradients and ablation are all edits.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from probes.common import ProbeInputError, hook_names
from probes.patching.cells import write_patch

HOOKS = {"heads": "blocks.{}.attn.hook_z", "resid": "blocks.{}.hook_resid_pre",
         "attn": "blocks.{}.hook_attn_out", "mlp": "blocks.{}.hook_mlp_out"}
Edits = dict[int, Callable[[torch.Tensor], torch.Tensor]]


class HookedTrace:
    def __init__(self, tokens: torch.Tensor, acts: dict[int, torch.Tensor], logits: torch.Tensor):
        self.tokens = tokens  # [batch pos]
        self.acts = acts  # {layer: [batch pos ...]}
        self.logits = logits  # [batch pos vocab]

    def act(self, what: str, layer: int) -> torch.Tensor:
        return self.acts[layer]


class EditingEngine:
    """What the engines that edit a whole forward share: tracing and patching through `run`."""
    suffix = False

    def run(self, tokens: torch.Tensor, edits: Edits) -> torch.Tensor:
        raise NotImplementedError

    def trace(self, tokens: torch.Tensor) -> HookedTrace:
        acts: dict[int, torch.Tensor] = {}

        def keep(layer: int):
            def edit(x: torch.Tensor) -> torch.Tensor:
                acts[layer] = x.detach().clone()
                return x
            return edit
        logits = self.run(tokens, {l: keep(l) for l in range(self.n_layers)})
        return HookedTrace(tokens, acts, logits)

    def patched(self, base: HookedTrace, donor: HookedTrace, what: str, layer: int, cells: list, start: int,
                last_only: bool) -> torch.Tensor:
        tokens = base.tokens.repeat(len(cells), 1)  # [cells*batch pos]
        logits = self.run(tokens, {layer: lambda x: write_patch(x.clone(), donor.acts[layer], cells)})
        return logits[:, -1:] if last_only else logits


class HookedEngine(EditingEngine):
    def __init__(self, model: Any, what: str, n_layers: int):
        self.model, self.what, self.n_layers = model, what, n_layers
        self.names = [HOOKS[what].format(l) for l in range(n_layers)]
        missing = [n for n in self.names if n not in hook_names(model)]
        if missing:
            raise ProbeInputError(f"{type(model).__name__} has no hook point {missing[0]}: cannot patch {what}")

    def run(self, tokens: torch.Tensor, edits: Edits) -> torch.Tensor:
        hooks = [(self.names[l], lambda x, hook, edit=edit: edit(x)) for l, edit in edits.items()]
        return self.model.run_with_hooks(tokens, fwd_hooks=hooks)
