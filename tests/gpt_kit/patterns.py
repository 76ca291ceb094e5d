"""The patterns a kit model computed itself, the reference the attention tap is checked against."""

from __future__ import annotations

import torch
import torch.nn as nn

from .nanochat import ChatGPT
from .tutorial import BatchedGPT, MhaGPT


def own_patterns(model: nn.Module, ids: torch.Tensor) -> list[torch.Tensor]:
    """A tutorial / nanochat-layout model's own patterns on ids, its SDPA models switched to their
    explicit path for the call only."""
    was = getattr(model, "explicit", None)
    with torch.no_grad():
        if isinstance(model, BatchedGPT):
            model.set_explicit(True)
        if isinstance(model, ChatGPT):
            model.keep = True
        if isinstance(model, MhaGPT):
            model.need_weights, was = True, model.need_weights
        try:
            model(ids)
            return [p.clone() for p in model.patterns]
        finally:
            if isinstance(model, BatchedGPT):
                model.set_explicit(bool(was))
            if isinstance(model, ChatGPT):
                model.keep = False
            if isinstance(model, MhaGPT):
                model.need_weights = was
