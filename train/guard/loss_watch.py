"""The loss judged against the run's own recent level (`train.guard`). Pure Python over numbers
already on the host: nothing here reads a tensor.

    watch = LossWatch(window=128, sigma=6.0, min_rise=0.3)
    watch.see(step, loss)        # takes the loss; True when it is a spike
    watch.excursion              # the spikes (step, loss) since the last loss under the spike line
    watch.calm(step)             # whether `step` is a state worth keeping

The level is the mean of the last `recent` calm losses; the noise is the standard deviation of one
step's loss around it, read from the differences of consecutive losses over the last `window` (a
falling loss, as early training's, does not count as noise). A spike lies more than
max(`sigma` x noise, `min_rise` nats) above the level; until `min_history` losses are held, a loss
`early_rise` nats above the first one is. Spikes stay out of the level. A step is calm when its
own loss is near the level (within max(3 x noise, min_rise / 2)) and a moving average of the loss
is within one noise of the window's mean (so a loss that crept up for 40 steps is traced back to
where the creeping began); the trouble began after the last calm step.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from train.guard.kinds import own_noise

__all__ = ["LossWatch"]


@dataclass
class LossWatch:
    window: int = 128  # losses the noise (and the calm band) are read from
    sigma: float = 6.0  # noises above the recent level that make a spike
    min_rise: float = 0.3  # nats: a spike is at least this far above the level
    recent: int = 16  # losses the recent level is the mean of
    min_history: int = 16  # losses held before the level judges (before: the first loss does)
    early_rise: float = 1.0  # nats above the first loss that make a spike before there is a level
    ema: float = 0.1  # weight of the newest loss in the moving average that traces trouble back
    _losses: deque = field(default_factory=deque, repr=False)  # (step, loss) of the window, spikes left out
    _avg: float | None = None  # the moving average
    _calm: int | None = None  # the last calm step
    first: float | None = None  # the first finite loss seen (the untrained model's)
    best: float | None = None  # the lowest finite loss seen
    excursion: list = field(default_factory=list)  # (step, loss) of the spikes in a row now
    last: tuple[int, float] | None = None  # the last (step, loss) seen

    # ------------------------------------------------------------------ the level

    def noise(self) -> float:
        """The standard deviation of one step's loss, from consecutive differences over the window."""
        return own_noise([v for _, v in self._losses])

    def level(self) -> float | None:
        """The mean of the last `recent` calm losses (None before any)."""
        tail = list(self._losses)[-self.recent:]
        return math.fsum(v for _, v in tail) / len(tail) if tail else None

    def judged(self) -> bool:
        return len(self._losses) >= self.min_history

    def lines(self) -> tuple[float, float, float]:
        """(the loss above which a step is a spike, the loss up to which it is calm, the noise)."""
        if not self.judged():
            line = (self.first if self.first is not None else math.inf) + self.early_rise
            return line, line, 0.0
        level, noise = self.level(), self.noise()
        return level + max(self.sigma * noise, self.min_rise), level + max(3 * noise, self.min_rise / 2), noise

    # ------------------------------------------------------------------ seeing a loss

    def see(self, step: int, loss: float) -> bool:
        """Take the loss of `step`; True when it is a spike (non-finite, or above the spike line)."""
        self.last = (step, loss)
        if not math.isfinite(loss):
            self.excursion.append((step, loss))
            return True
        if self.first is None:
            self.first = loss
        self.best = loss if self.best is None else min(self.best, loss)
        spike_line, calm_line, noise = self.lines()
        if loss > spike_line:
            self.excursion.append((step, loss))
            return True
        calm = loss <= calm_line
        self.excursion = []
        if self.judged():
            self._avg = loss if self._avg is None else self.ema * loss + (1 - self.ema) * self._avg
            calm = calm and self._avg <= math.fsum(v for _, v in self._losses) / len(self._losses) + noise
        if calm:
            self._calm = step
        self._losses.append((step, loss))
        while len(self._losses) > self.window:
            self._losses.popleft()
        return False

    def calm(self, step: int) -> bool:
        """Whether `step` is calm (its own loss near the level, no creep; nothing seen yet counts as
        calm: the state training starts from): a state to keep."""
        return self.last is None or self._calm is not None and self._calm >= step

    def trouble_began(self) -> int:
        """The first step of the trouble now seen: the step after the last calm one (at most the
        first spike of the excursion)."""
        first_spike = self.excursion[0][0] if self.excursion else None
        if self._calm is None:
            began = self._losses[0][0] if self._losses else (self.last[0] if self.last else 0)
        else:
            began = self._calm + 1
        return began if first_spike is None else min(began, first_spike)

    # ------------------------------------------------------------------ after the guard acts

    def restart(self, step: int, keep_before: int | None) -> None:
        """The run's state went back (a skip or a rewind at `step`): forget the excursion and the
        losses after `keep_before` (the level starts again from those before the trouble); the state
        now is calm as of `step`."""
        if keep_before is not None:
            self._losses = deque((s, v) for s, v in self._losses if s < keep_before)
        self._avg, self.excursion, self._calm = None, [], step

    def accept(self, step: int) -> None:
        """A new level the run learns from (a data shift): the excursion's losses become the level."""
        self._losses = deque(self.excursion)
        self.excursion, self._avg, self._calm = [], None, step
