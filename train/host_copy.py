"""A step's readings brought from the device in one transfer.

The Monitor measures on the device (norms, entropies, counts: tensors) and reads the numbers on
the host only when it writes the record. Every `.item()` / `float()` / `.tolist()` of a CUDA
tensor makes Python wait for the GPU to finish all the work queued before it, so the readings of
one step travel together: packed into one float64 vector on the device, copied with
`non_blocking=True` (into pinned memory, so the copy is queued and Python goes on), and read after
a CUDA event says the copy is done. On a CPU the same code runs with nothing to wait for.

float64 holds every reading exactly: float32 and half values, and integer counts below 2**53.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

__all__ = ["HostCopy"]


class HostCopy:
    """The tensors in `tree` (dicts, lists, tuples; other leaves pass through) copied to the host
    in one transfer per device, started at once. `get()` waits for it and returns the tree with
    each 0-d tensor as a float and each 1-d tensor as a list of floats, passed through `finish`
    (host-side work on the numbers) once."""

    def __init__(self, tree: Any, finish: Callable[[Any], Any] | None = None):
        self._leaves, self._spec = tree_flatten(tree)
        self._finish = finish
        self._result: Any = None
        self._done = False
        tensors = [t for t in self._leaves if isinstance(t, torch.Tensor)]
        for t in tensors:
            if t.dim() > 1:
                raise ValueError(f"HostCopy reads 0-d and 1-d tensors, got one of shape {list(t.shape)}")
        self._copies = [self._start(group) for group in by_device(tensors)]

    @staticmethod
    def _start(tensors: list[torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor, Any]:
        """One device's tensors packed into float64 (one cat per dtype, then one), copied to the host."""
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in tensors:
            by_dtype.setdefault(t.dtype, []).append(t)
        order = [t for group in by_dtype.values() for t in group]
        parts = [torch.cat([t.detach().reshape(-1) for t in group]).to(torch.float64) for group in by_dtype.values()]
        flat = parts[0] if len(parts) == 1 else torch.cat(parts)  # [values]
        host = flat.to("cpu", non_blocking=True)  # pinned and queued from a GPU; itself on a CPU
        event = None
        if flat.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        return order, host, event

    def get(self) -> Any:
        """The tree with Python numbers (waits for the copy the first time only)."""
        if self._done:
            return self._result
        values: dict[int, float | list[float]] = {}
        for order, host, event in self._copies:
            if event is not None:
                event.synchronize()
            numbers, at = host.tolist(), 0
            for t in order:
                n = t.numel()
                values[id(t)] = numbers[at] if t.dim() == 0 else numbers[at:at + n]
                at += n
        leaves = [values[id(t)] if isinstance(t, torch.Tensor) else t for t in self._leaves]
        tree = tree_unflatten(leaves, self._spec)
        self._result = self._finish(tree) if self._finish is not None else tree
        self._done, self._leaves, self._copies = True, [], []  # let the device tensors go
        return self._result


def by_device(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    groups: dict[torch.device, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault(t.device, []).append(t)
    return list(groups.values())
