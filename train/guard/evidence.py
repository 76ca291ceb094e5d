"""What a rescue's plan reads of the guard at work (`train.guard.run.GuardedRun`), as a protocol:
`planning` and `rates` type the run against it and never import `run` (which imports them). Two
fields are written back by a plan: `first_rate` (the floor's base) and `calm_from` (a lift's clock)."""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol

from train.guard.loss_watch import LossWatch
from train.guard.rate import RateCap
from train.guard.settings import Settings
from train.guard.snapshot import HostSnapshot

__all__ = ["Evidence"]


class Evidence(Protocol):
    """The guard's run as its plans see it: settings, the rate cap, the losses watched, the rates and
    update ratios of recent steps, the states held and the rescues so far."""

    settings: Settings
    rate: RateCap
    watch: LossWatch
    rates: deque  # (step, the rate its update applied)
    ratios: deque  # (step, median update ratio, its update's rate, calm)
    rescues: list[dict[str, Any]]
    acts: int  # rewinds so far
    recovery: Any  # after a rewind: `.target`, the level the run must head back to; else None
    last_restored: HostSnapshot | None
    unsafe: float | None  # the lowest rate at which a rate blow-up began
    first_rate: float | None  # written by a plan: the rate when rate trouble first came
    calm_from: int | None  # written by a lift: the step since which a capped run is calm

    def _held(self) -> list[HostSnapshot]: ...

    def _said(self, action: str) -> str: ...
