"""A 2-D picture of an embedding table: PCA of its rows (the app's embedding map).

    from probes import projection
    coords, explained = projection.run(model, table="input")   # [d_vocab 2], [2]
"""

from __future__ import annotations

from typing import Any

import torch

from probes.common import ProbeInputError
from probes.neighbours import input_table, output_table


def pca_2d(table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of `table` [n d] projected on its first two principal axes: ([n 2], explained [2]).

    The columns are centred; `explained` is each axis's fraction of the total variance. Signs
    are fixed so that the first row off the origin is positive on each axis (SVD signs are
    arbitrary), which keeps the picture stable between calls.
    """
    if table.dim() != 2 or table.shape[0] < 2:
        raise ProbeInputError(f"PCA needs a [n d] table with n >= 2, got {tuple(table.shape)}")
    if not bool(torch.isfinite(table).all()):
        raise ProbeInputError("the embedding table holds NaN or inf: no projection to draw")
    x = table.detach().double()
    x = x - x.mean(0, keepdim=True)  # [n d]
    u, s, _ = torch.linalg.svd(x, full_matrices=False)
    coords = u[:, :2] * s[:2]  # [n 2]
    if coords.shape[1] < 2:
        coords = torch.cat([coords, torch.zeros(coords.shape[0], 2 - coords.shape[1], dtype=coords.dtype)], 1)
    for axis in range(2):  # the first row off the origin gets a positive coordinate
        column = coords[:, axis]
        off = (column.abs() > 1e-9 * column.abs().max()).nonzero()
        if len(off) and column[off[0, 0]] < 0:
            coords[:, axis] = -column
    total = s.pow(2).sum()
    explained = torch.zeros(2, dtype=torch.float64)
    explained[: min(2, len(s))] = s[:2].pow(2) / total if total > 0 else 0.0
    return coords.float(), explained.float()


def run(model: Any, table: str = "input") -> tuple[torch.Tensor, torch.Tensor]:
    """PCA of the model's input embedding rows or output (unembedding) vectors."""
    if table not in ("input", "output"):
        raise ProbeInputError(f"table must be 'input' or 'output', got {table!r}")
    return pca_2d(input_table(model) if table == "input" else output_table(model))
