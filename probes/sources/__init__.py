"""The attention sources a probe reads a model through, one module per kind: `hooked` (our hook points
and a TransformerBridge's), `tapped` (any other module, through the tap), `saved` (a snapshot's
saved readings), all `attention.AttentionSource`s. Here, the chooser:

`source_of(model, tokens)`: the one attention source a probe run reads (`probes.sources.attention`),
made from what the runner was given: an `AttentionSource` itself (a saved snapshot's readings, or
the one a CLI already made) passes through; ours and a TransformerBridge read at their hook points
(`HookedSource`); any other module through the tap (`TappedSource`: `tokens`, [batch pos] ids or a
list of batches, give its context where it names none, after `context`: one read elsewhere).
`snapshot_source(snap)`: a CLI's source of a loaded snapshot, its recorded context given."""

from __future__ import annotations

import sys
from typing import Any

import torch

from models.store.any_model import SavedModel
from probes.errors import ProbeInputError
from probes.sources.attention import AttentionSource, has_lens_cfg
from probes.sources.hooked import HookedSource
from probes.sources.saved import SavedSource
from probes.sources.tapped import TappedSource


def source_of(model: Any, tokens: Any = None, context: int | None = None) -> AttentionSource:
    if isinstance(model, AttentionSource):
        return model
    if isinstance(model, SavedModel):  # a snapshot of any model, without its code: what it saved
        return SavedSource(model)
    if has_lens_cfg(model):
        return HookedSource(model)
    if isinstance(model, torch.nn.Module):
        return TappedSource(model, tokens, context)
    raise ProbeInputError(f"{type(model).__name__} is not a model: give one of ours, a TransformerBridge, any "
                          "torch.nn.Module mapping [batch pos] ids to logits, or an attention source")


def snapshot_source(snap: Any) -> AttentionSource:
    """The source a CLI reads a loaded snapshot through. A module that names no context of its own
    (a user's GPT rebuilt with --model-code) is read in windows of the context its snapshot recorded,
    and a line on stderr says so: windows of the 8 tokens of the first check would read a 49-token
    text in 7 pieces."""
    recorded = getattr(getattr(snap, "config", None), "n_ctx", None)
    attn = source_of(snap.model, context=recorded if isinstance(recorded, int) and recorded > 0 else None)
    said = getattr(attn, "context_said", None)
    if said:
        print(f"note: {said}", file=sys.stderr)
    return attn
