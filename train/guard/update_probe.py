"""One update's ratio measured when the guard needs it (`train.guard`): between the Monitor's log
steps, or with no Monitor at all (`Guard.attach`), the update ratio of the next optimizer step,
median over the parameters of rms(du) / rms(w), as the Monitor measures it at its log steps.

Armed only while an episode waits on its ratios (`GuardedRun`): a copy of the parameters before
that one step and a host read after it; a healthy run never arms it (its weights are only read).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["UpdateProbe"]


class UpdateProbe:
    """The next update's median ratio, once armed (`arm`; `take` hands it over)."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer
        self.armed = False
        self.before: list[torch.Tensor] | None = None
        self.value: float | None = None  # the last ratio measured, until taken
        self.handles = [optimizer.register_step_pre_hook(self._before), optimizer.register_step_post_hook(self._after)]

    def _params(self) -> list[torch.Tensor]:
        return [p for g in self.optimizer.param_groups for p in g["params"] if p.requires_grad]

    def arm(self) -> None:
        self.armed = True

    def take(self) -> float | None:
        value, self.value = self.value, None
        return value

    def _before(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.armed:
            self.before = [p.detach().clone() for p in self._params()]

    @torch.no_grad()
    def _after(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        before, self.before, self.armed = self.before, None, False
        if before is None:
            return
        ratios = []
        for p, was in zip(self._params(), before):
            w = p.detach().float()
            ratios.append((w - was.float()).pow(2).mean().sqrt() / w.pow(2).mean().sqrt().clamp_min(1e-12))
        if ratios:  # the upper median, as the Monitor's (train.guard.monitor.median_ratio); one host read
            self.value = float(torch.stack(ratios).sort().values[len(ratios) // 2])

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
