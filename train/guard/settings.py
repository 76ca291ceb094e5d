"""The guard's settings, checked when made: `Settings`, the fields of the public `train.guard.Guard`
(which adds `attach`). Torch-free, plain numbers; it imports nothing of the guard's, so every part
of the guard (`run`, `planning`, ...) reads its settings from below."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["MODES", "Settings"]

MODES = ("act", "watch")
BIG = 10 ** 6  # the most steps any size may span (a run of a million steps between snapshots is no guard)
MAX_KEEP = 64  # snapshots held: each is a full copy of the model and optimizer state in host memory


@dataclass(frozen=True)
class Settings:
    """The guard's settings (made as `train.guard.Guard`; its messages name it so). `mode="watch"` logs
    what it would do and changes nothing."""

    mode: str = "act"
    every: int = 10  # steps between snapshots (taken at a calm step, at most one per `every`)
    keep: int = 4  # snapshots held: how far back a rewind can reach (about keep * every steps)
    cut: float = 0.3  # the rate cut where the run gives no better evidence (no update ratios measured)
    rewarm: int = 50  # steps over which the rate climbs back after a rewind (the optimizer's state is shaken)
    max_rescues: int = 4  # rewinds (rate blow-ups and stalls) before the next one stops the run
    floor: float = 1e-3  # the lowest cap, as a fraction of the rate when the trouble first came: below it, a stop
    sigma: float = 6.0  # a spike: this many standard deviations above the recent level ...
    min_rise: float = 0.3  # ... and at least this many nats above it
    window: int = 128  # losses the recent level and noise are taken over
    patience: int = 2  # spikes in a row that make trouble (a non-finite loss at once)
    hold: int = 16  # spikes in a row that are no longer a few bad batches: a blow-up or a shift
    stall_window: int = 64  # steps after a rewind within which the loss must head back to its level
    lift_after: int = 50  # calm steps after a recovery before a cap is doubled (and again after as many)
    read_every: int = 10  # without a Monitor: a loss logged as a tensor is read (a device sync) this often
    scaler: Any = field(default=None, compare=False, repr=False)  # a torch.amp.GradScaler, snapshotted too

    def __post_init__(self) -> None:
        if not isinstance(self.mode, str) or self.mode not in MODES:
            raise ValueError(f"Guard: mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        for name, low, high in (("every", 1, BIG), ("keep", 1, MAX_KEEP), ("rewarm", 1, BIG),
                                ("max_rescues", 0, 1000), ("window", 2, BIG), ("patience", 1, BIG),
                                ("hold", 2, BIG), ("stall_window", 8, BIG), ("lift_after", 1, BIG),
                                ("read_every", 1, BIG)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"Guard: {name} must be an integer in [{low}, {high}], got {value!r}")
        if self.hold <= self.patience:
            raise ValueError(f"Guard: hold must be above patience ({self.patience}), got {self.hold!r}")
        for name, ok, want in (("cut", lambda v: 0 < v < 1, "a number in (0, 1)"),
                               ("floor", lambda v: 0 < v < 1, "a number in (0, 1)"),
                               ("sigma", lambda v: v > 0, "a positive number"),
                               ("min_rise", lambda v: v >= 0, "a number >= 0")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not ok(value):
                raise ValueError(f"Guard: {name} must be {want}, got {value!r}")
        if self.scaler is not None and not all(callable(getattr(self.scaler, m, None))
                                               for m in ("scale", "update", "unscale_")):
            raise ValueError(f"Guard: scaler must be a torch.amp.GradScaler or None, got {type(self.scaler).__name__}")

    def to_json(self) -> dict[str, Any]:
        """What run.json records of a guarded run (its mode and every setting): a guarded run that never
        acted is told from an unguarded one, and a sweep's recipes compare with their guards."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "scaler"}
        return {**out, "scaler": self.scaler is not None}
