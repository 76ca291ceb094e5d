"""What the attention tap (`models.tap`) gives a model and learns about it without reading its
attention: how long a window it may read, and what its forward needs beside the ids.

- `context_of(model)`: the context its config names (`max_position_embeddings`, `n_ctx`,
  `n_positions`, `block_size`, `sequence_len`, `context_length`, `max_seq_len`), else the rows of
  its learned position table (an `nn.Embedding` or a `[pos d]` parameter named like `wpe`,
  `pos_emb`, `position_embedding_table`, `pos_embedding`), else the size of a square causal-mask
  buffer (`tril`, `mask`, `bias` of `[.. n n]`, as tutorials register), else None. A tutorial GPT
  has no config, and 100 ids against its 64-row position table would be an IndexError.
- `forward_inputs(model, ids)`: the keyword arguments its forward needs beside the ids: an
  `attention_mask` of ones (`[batch pos]`, Hugging Face's meaning: every token is real) where
  the forward requires one; any other required argument is refused in one line naming it.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from models.tap_rebuild import TapError

__all__ = ["context_of", "forward_inputs", "CONTEXT_ATTRS"]

CONTEXT_ATTRS = ("max_position_embeddings", "n_ctx", "n_positions", "block_size", "sequence_len",
                 "context_length", "max_seq_len")
POSITION_NAMES = ("wpe", "pos_emb", "pos_embed", "pos_embedding", "position_embedding",
                  "position_embeddings", "position_embedding_table", "positional_embedding", "W_pos")
MASK_NAMES = ("tril", "mask", "bias", "causal_mask", "attn_mask")
FILLED = ("attention_mask",)  # required forward arguments the tap can give: ones, [batch pos]


def context_of(model: Any) -> int | None:
    """The model's context length: its config's (`config` or `cfg`) or its own, else what its
    position table or causal-mask buffer holds; None when nothing says."""
    for holder in (getattr(model, "config", None), getattr(model, "cfg", None), model):
        for attr in CONTEXT_ATTRS:
            value = getattr(holder, attr, None) if holder is not None else None
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    if isinstance(model, torch.nn.Module):
        return position_rows(model) or mask_size(model)
    return None


def position_rows(model: torch.nn.Module) -> int | None:
    """Rows of the learned position table (the fewest, should there be several)."""
    rows = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Embedding) and name.rsplit(".", 1)[-1] in POSITION_NAMES:
            rows.append(module.num_embeddings)
    for name, param in model.named_parameters():
        if name.rsplit(".", 1)[-1] in POSITION_NAMES and param.dim() == 2:
            rows.append(param.shape[0])  # [pos d]
    return min(rows) if rows else None


def mask_size(model: torch.nn.Module) -> int | None:
    """n of a square causal-mask buffer [.. n n] (a tutorial's `tril` of ones up to its context)."""
    sizes = [b.shape[-1] for name, b in model.named_buffers()
             if name.rsplit(".", 1)[-1] in MASK_NAMES and b.dim() >= 2 and b.shape[-1] == b.shape[-2] > 1]
    return min(sizes) if sizes else None


def forward_inputs(model: torch.nn.Module, ids: torch.Tensor) -> dict[str, Any]:
    """Keyword arguments beside the ids [batch pos] that the model's forward requires."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):  # a builtin or C forward: nothing to read
        return {}
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
             inspect.Parameter.KEYWORD_ONLY)
    required = [p.name for p in params[1:] if p.kind in kinds and p.default is inspect.Parameter.empty]
    other = [name for name in required if name not in FILLED]
    if other:
        raise TapError(f"{type(model).__name__}.forward requires {', '.join(other)} beside the ids, which the tap "
                       "cannot make up: wrap it in a module whose forward(ids) returns the logits")
    return {name: torch.ones_like(ids) for name in required}
