"""`source_of(model, tokens)`: the one attention source a probe run reads (`probes.attention_source`),
made from what the runner was given: an `AttentionSource` itself (a saved snapshot's readings, or
the one a CLI already made) passes through; ours and a TransformerBridge read at their hook points
(`HookedSource`); any other module through the tap (`TappedSource`: `tokens`, [batch pos] ids or a
list of batches, give its context where it names none)."""

from __future__ import annotations

from typing import Any

import torch

from models.store.any_model import SavedModel
from probes.attention_source import AttentionSource, has_lens_cfg
from probes.errors import ProbeInputError
from probes.hooked_source import HookedSource
from probes.saved_source import SavedSource
from probes.tapped_source import TappedSource


def source_of(model: Any, tokens: Any = None) -> AttentionSource:
    if isinstance(model, AttentionSource):
        return model
    if isinstance(model, SavedModel):  # a snapshot of any model, without its code: what it saved
        return SavedSource(model)
    if has_lens_cfg(model):
        return HookedSource(model)
    if isinstance(model, torch.nn.Module):
        return TappedSource(model, tokens)
    raise ProbeInputError(f"{type(model).__name__} is not a model: give one of ours, a TransformerBridge, any "
                          "torch.nn.Module mapping [batch pos] ids to logits, or an attention source")
