"""Which activations a sweep patches, in TransformerLens's layout, and the one function that writes
a donor run's slice into each row of a batch of patched runs.

A cell is (position, head): position None means every position, head None every head (the whole
activation at that position). Per layer the cells run in the order of the result's layout:
heads by position [layer pos head], heads [layer head], by position [layer pos], else [layer].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

WHATS = ("heads", "resid", "attn", "mlp")
DIRECTIONS = ("denoise", "noise")


@dataclass(frozen=True)
class Sweep:
    what: str
    by_position: bool
    n_layers: int
    n_pos: int
    n_heads: int

    @property
    def shape(self) -> tuple[int, ...]:
        """The result's shape: [layer pos head], [layer head], [layer pos] or [layer]."""
        inner = ((self.n_pos,) if self.by_position else ()) + ((self.n_heads,) if self.what == "heads" else ())
        return (self.n_layers, *inner)

    @property
    def axes(self) -> list[str]:
        return ["layer"] + (["pos"] if self.by_position else []) + (["head"] if self.what == "heads" else [])

    def cells(self) -> list[tuple[int | None, int | None]]:
        """One layer's cells in layout order."""
        positions = range(self.n_pos) if self.by_position else [None]
        heads = range(self.n_heads) if self.what == "heads" else [None]
        return [(p, h) for p in positions for h in heads]

    def cell_of(self, index: tuple[int, ...]) -> tuple[int, int | None, int | None]:
        """(layer, position, head) of an index into the result (negative indices count from the end)."""
        if len(index) != len(self.shape):
            raise ValueError(f"an index into a {list(self.shape)} result has {len(self.shape)} numbers, got {index}")
        index = tuple(int(i) % n if -n <= int(i) < n else _out(i, n) for i, n in zip(index, self.shape))
        pos = index[1] if self.by_position else None
        head = index[-1] if self.what == "heads" else None
        return index[0], pos, head


def _out(i: int, n: int) -> int:
    raise ValueError(f"index {i} is outside 0..{n - 1}")


def first_position(cells: list[tuple[int | None, int | None]]) -> int:
    """The earliest position a chunk of cells patches: nothing before it can change (causal)."""
    return min((0 if p is None else p) for p, _ in cells)


def write_patch(x: torch.Tensor, donor: torch.Tensor, cells: list[tuple[int | None, int | None]],
                start: int = 0) -> torch.Tensor:
    """Each chunk of `batch` rows of x gets one cell's slice of the donor, in place.

    x: [cells*batch pos-start ...] (positions from `start` on), patch-major;
    donor: [batch pos ...] ([batch pos head d_head] when cells name heads). Returns x.
    """
    n, batch = len(cells), donor.shape[0]
    runs = x.unflatten(0, (n, batch))  # [cells batch pos-start ...] (a view, even of a transpose)
    for i, (pos, head) in enumerate(cells):
        if pos is None:
            src, dst = donor[:, start:], runs[i]
        else:
            src, dst = donor[:, pos], runs[i, :, pos - start]
        if head is None:
            dst.copy_(src)
        else:
            dst[..., head, :].copy_(src[..., head, :])
    return x
