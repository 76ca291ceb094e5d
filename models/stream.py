"""The residual stream of any model, read at its blocks: what enters block 0, and the stream after each
block, whether the block returns the stream (`x = block(x)`, nanoGPT's) or only what it adds, its
parent adding the residual (`x = x + block(x)`, many tutorial GPTs). Torch only; knows no probe.

Which of the two a model is comes from one forward: after a delta-returning block i, the next part
reads in_i + out_i (the next block's input, or the input of the module the last block's stream goes to:
the final norm, or the unembedding where there is none); after a stream-returning one, out_i itself.
Only where every comparison says "delta" is the stream taken as in_i + out_i: a model that mixes in
more between its blocks (nanochat scales the stream and adds the embedding back before each block)
reads its blocks' outputs, as before.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from models.layout import first_tensor

__all__ = ["StreamReader"]

SAME = 1e-5  # relative: in_i + out_i is the very sum the parent made (an in-place `+=` too), up to float order


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape:
        return False
    a, b = a.float(), b.float()
    return bool(((a - b).abs().amax() <= SAME * max(float(b.abs().amax()), 1e-30)).item())


class StreamReader:
    """Hooks on `blocks` and on `end` (the module the last block's stream goes to, or None) for one
    forward; `residuals()` then gives the stream [batch pos d_model] entering block 0 and after each
    block (n + 1 tensors, detached). Use as a context manager around the forward. `delta`: whether
    the blocks return what their parent adds, as an earlier forward found (`returns_delta` reads values
    on the host: a loop's later forwards pass what its first found, and keep only what that needs);
    None: found in this forward."""

    def __init__(self, blocks: Sequence[nn.Module], end: nn.Module | None = None, delta: bool | None = None):
        self.blocks, self.end, self.delta = list(blocks), end, delta
        self.inputs: dict[int, torch.Tensor] = {}  # block index (n: `end`) -> what it read
        self.outputs: dict[int, torch.Tensor] = {}
        self._handles: list[Any] = []

    def __enter__(self) -> StreamReader:
        def entering(i: int):
            def hook(module: Any, args: tuple, kwargs: dict) -> None:
                x = first_tensor(args) if args else next((v for v in kwargs.values() if isinstance(v, torch.Tensor)), None)
                if x is not None:
                    self.inputs[i] = x.detach().clone()  # cloned: `x += block(x)` changes it in place
            return hook

        def leaving(i: int):
            def hook(module: Any, args: tuple, output: Any) -> None:
                out = first_tensor(output)
                if out is not None:
                    self.outputs[i] = out.detach()
            return hook

        # known stream-returning blocks: block 0's input is all the stream needs besides the outputs
        entered = self.blocks if self.delta is not False else self.blocks[:1]
        parts = entered + ([self.end] if self.end is not None and self.delta is None else [])
        self._handles = [m.register_forward_pre_hook(entering(i), with_kwargs=True) for i, m in enumerate(parts)]
        self._handles += [b.register_forward_hook(leaving(i)) for i, b in enumerate(self.blocks)]
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def returns_delta(self) -> bool:
        """Whether every block whose next reading was seen returned what its parent adds."""
        checks = [same(self.inputs[i + 1], self.inputs[i] + self.outputs[i]) and not same(self.inputs[i + 1], self.outputs[i])
                  for i in range(len(self.blocks)) if {i, i + 1} <= self.inputs.keys() and i in self.outputs]
        return bool(checks) and all(checks)

    def residuals(self) -> list[torch.Tensor]:
        """The stream entering block 0, then after each block: [batch pos d_model] each."""
        n = len(self.blocks)
        if not (0 in self.inputs and all(i in self.outputs for i in range(n))):
            missing = next(i for i in range(n) if i not in self.outputs) if 0 in self.inputs else 0
            raise ValueError(f"block {missing} of {n} was not called with a tensor in the forward")
        if self.returns_delta() if self.delta is None else self.delta:
            return [self.inputs[0]] + [self.inputs[i] + self.outputs[i] for i in range(n)]
        return [self.inputs[0]] + [self.outputs[i] for i in range(n)]
