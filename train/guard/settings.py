"""The guard's settings (`Guard`), checked when made. Torch-free: the settings are plain numbers."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Guard", "MODES"]

MODES = ("act", "watch")


@dataclass(frozen=True)
class Guard:
    """The guard's settings. `mode="watch"` logs what it would do and changes nothing."""

    mode: str = "act"
    every: int = 50  # steps between snapshots (taken at a calm check, at most one per `every`)
    keep: int = 3  # snapshots held: how far back a rewind can reach (about keep * every steps)
    cut: float = 0.3  # the k-th rescue caps the rate at cut**k times the schedule's rate at the restored state
    rewarm: int = 50  # steps over which the rate climbs back after a rewind (the optimizer's state is shaken)
    max_rescues: int = 2  # rescues before the next trouble stops the run
    sigma: float = 6.0  # a spike: this many standard deviations above the recent mean ...
    min_rise: float = 0.3  # ... and at least this many nats above it
    window: int = 128  # losses the recent mean and deviation are taken over
    patience: int = 2  # spikes in a row that make trouble (a non-finite loss at once)
    read_every: int = 10  # without a Monitor: a loss logged as a tensor is read (a device sync) this often
    scaler: Any = field(default=None, compare=False, repr=False)  # a torch.amp.GradScaler, snapshotted too

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"Guard: mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        for name, low in (("every", 1), ("keep", 1), ("rewarm", 1), ("max_rescues", 0), ("window", 2),
                          ("patience", 1), ("read_every", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"Guard: {name} must be an integer >= {low}, got {value!r}")
        for name, ok, want in (("cut", 0 < self.cut <= 1, "a number in (0, 1]"),
                               ("sigma", self.sigma > 0, "a positive number"),
                               ("min_rise", self.min_rise >= 0, "a number >= 0")):
            if not ok or not math.isfinite(getattr(self, name)):
                raise ValueError(f"Guard: {name} must be {want}, got {getattr(self, name)!r}")

    def attach(self, model: Any, optimizer: Any, start_step: int = 0) -> Any:
        """A guard on this model and optimizer without a Monitor (a DDP rank other than 0):
        `run.log(step, train_loss=...)` judges and acts as `Monitor.log` does; `run.close()` unhooks.
        `start_step`: the step number of the first update (as the Monitor's)."""
        from train.guard.run import GuardedRun
        from train.monitor_parts import first_optimizer
        return GuardedRun(self, model, first_optimizer(optimizer), start_step)
