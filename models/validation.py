"""Input checks shared by the models: one-line ValueErrors that name the problem."""

from __future__ import annotations

import torch


def check_tokens(tokens: torch.Tensor, d_vocab: int, n_ctx: int | None = None,
                 min_len: int = 1, check_range: bool = True) -> torch.Tensor:
    """Validate a token batch and return it as [batch pos] int64 (a 1-D input gains a batch axis).
    `check_range=False` leaves the ids' range to the caller's embedding lookup, which raises
    IndexError on one outside the vocabulary: `vocabulary_error` then names it. That saves a
    pass over the ids per forward (the Transformer's forward does this)."""
    if not isinstance(tokens, torch.Tensor):
        raise ValueError(f"tokens must be a torch.Tensor of ids, got {type(tokens).__name__}")
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool or tokens.is_complex():
        raise ValueError(f"tokens must be integer ids, got dtype {tokens.dtype}")
    if tokens.dim() == 1:
        tokens = tokens.unsqueeze(0)
    if tokens.dim() != 2:
        raise ValueError(f"tokens must have shape [batch pos], got {tuple(tokens.shape)}")
    if tokens.shape[1] < min_len:
        raise ValueError(f"need at least {min_len} token(s) per row, got {tokens.shape[1]}")
    if n_ctx is not None and tokens.shape[1] > n_ctx:
        raise ValueError(f"sequence of {tokens.shape[1]} tokens is longer than the model's "
                         f"context of {n_ctx}; window it (probes do this for you)")
    # the range check reads min/max: free on the CPU, a host sync per call on an accelerator (where
    # callers check ids on the CPU before moving them; an id out of range still fails in the
    # embedding), and a graph break under torch.compile
    if check_range and tokens.numel() and tokens.device.type == "cpu" and not torch.compiler.is_compiling():
        error = vocabulary_error(tokens, d_vocab)
        if error is not None:
            raise error
    return tokens if tokens.dtype == torch.int64 else tokens.long()


def vocabulary_error(tokens: torch.Tensor, d_vocab: int) -> ValueError | None:
    """The error naming an id of `tokens` outside [0, d_vocab), or None if every id is inside."""
    low, high = map(int, torch.aminmax(tokens))  # one pass over the ids, not two
    if low < 0 or high >= d_vocab:
        bad = low if low < 0 else high
        return ValueError(f"token id {bad} is outside the vocabulary [0, {d_vocab})")
    return None
