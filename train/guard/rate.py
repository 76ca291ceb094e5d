"""The guard's rate cap, applied around the optimizer's own step (`train.guard`).

Just before the step each capped param group's rate is scaled by min(1, cap / the highest rate
its schedule asked for since the cap was set) (a climbing schedule trains at the cap, a falling
one keeps its shape) and, over the first `rewarm` steps after a rewind, by a ramp up from
1/rewarm; just after it the user's value is put back, so a scheduler (or a loop setting g["lr"] by
hand) stays in charge and reads its own numbers. With no cap nothing is written: a healthy run is
untouched. The rate each update applied (the first group's) is kept as evidence for the guard.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["RateCap", "rate_of"]


def rate_of(lr: Any) -> float:
    return float(lr) if not isinstance(lr, torch.Tensor) else float(lr.detach())


class RateCap:
    """The caps of one optimizer's param groups and the hooks that apply them."""

    def __init__(self, optimizer: torch.optim.Optimizer, rewarm: int):
        self.rewarm = rewarm
        self.ceilings: list[float | None] = []  # per param group; none until a rate rescue
        self.peaks: list[Any] = []  # per param group: its highest asked rate since the cap was set
        self.since: int | None = None  # optimizer steps since the last rewind (the ramp back up); None: no ramp
        self.asked: list[Any] = []  # each group's rate the user set for the last update (before any cap)
        self.applied: Any = None  # the first group's rate the last update applied (a tensor stays one)
        self._user_lrs: list[Any] | None = None  # the user's rates while the step runs capped
        self.handles = [optimizer.register_step_pre_hook(self._cap), optimizer.register_step_post_hook(self._uncap)]

    @property
    def cap(self) -> float | None:
        """The first group's cap (the one records name), or None."""
        return self.ceilings[0] if self.ceilings else None

    def set(self, cap: float, ramp: bool) -> None:
        """Cap the first group's rate at `cap`, the others in the ratio their rates have now."""
        asked = [rate_of(lr) for lr in self.asked] or [cap]
        base = asked[0]
        self.ceilings = [cap * (a / base) if base > 0 else cap for a in asked]
        self.peaks = [None] * len(self.ceilings)
        if ramp:
            self.since = 0

    def lift(self, cap: float | None) -> None:
        """Raise the caps to `cap` (the first group's; None: no cap), keeping the groups' ratios."""
        if cap is None or not self.ceilings:
            self.ceilings, self.peaks = [], []
            return
        scale = cap / self.ceilings[0]
        self.ceilings = [c * scale if c is not None else None for c in self.ceilings]

    def _cap(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        groups = optimizer.param_groups
        self.asked = [g["lr"] for g in groups]
        self.applied = self.asked[0] if self.asked else None
        ramp = 1.0
        if self.since is not None:
            self.since += 1
            ramp = min(1.0, self.since / self.rewarm)
            if ramp >= 1.0:
                self.since = None
        if not self.ceilings and ramp >= 1.0:
            return
        self._user_lrs = list(self.asked)
        ceilings = self.ceilings or [None] * len(groups)
        for i, (g, ceiling) in enumerate(zip(groups, ceilings)):
            lr = g["lr"]
            factor: Any = ramp
            if ceiling is not None:
                peak = self.peaks[i]
                if isinstance(lr, torch.Tensor):  # no read of a device value: tensors all the way
                    self.peaks[i] = lr.detach().clone() if peak is None else torch.maximum(peak, lr)
                    factor = torch.clamp(ceiling / self.peaks[i], max=1.0) * ramp
                else:
                    self.peaks[i] = lr if peak is None else max(peak, lr)
                    factor = (min(1.0, ceiling / self.peaks[i]) if self.peaks[i] > 0 else 1.0) * ramp
            if isinstance(factor, torch.Tensor) or factor < 1.0:
                g["lr"] = lr * factor
        self.applied = groups[0]["lr"]

    def _uncap(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._user_lrs is not None:
            for g, lr in zip(optimizer.param_groups, self._user_lrs):
                g["lr"] = lr
            self._user_lrs = None

    def peak(self) -> float | None:
        """The first group's highest asked rate since the cap was set (None before a capped step)."""
        return rate_of(self.peaks[0]) if self.peaks and self.peaks[0] is not None else None

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
