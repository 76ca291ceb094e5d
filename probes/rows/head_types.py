"""The two per-row readings of an attention pattern that define head types: the mass on the
previous token and on the first position. `probes.heads` scores previous-token and sink heads
with them; `probes.degenerate`'s "previous" and "sink" evidence (`probes.rows.stats`, and
`probes.rows.qk` on patterns it rebuilds block by block) reads the same numbers. Below all of
them, so that each imports these one way.
"""

from __future__ import annotations

import torch

__all__ = ["first_position_rows", "previous_token_rows"]


def previous_token_rows(pattern: torch.Tensor, first_row: int = 0) -> torch.Tensor:
    """P[i, i-1] for each query row: [... q k] -> [... q] (0 for row 0). The rows may be a block
    of a causal pattern starting at row `first_row` (keys 0.. as in the full pattern)."""
    sub = pattern.diagonal(offset=first_row - 1, dim1=-2, dim2=-1)  # rows max(first_row, 1)..
    if first_row > 0:
        return sub
    return torch.cat([sub.new_zeros(*sub.shape[:-1], 1), sub], dim=-1)


def first_position_rows(pattern: torch.Tensor) -> torch.Tensor:
    """P[i, 0], the mass on the first position: [... q k] -> [... q]."""
    return pattern[..., 0]
