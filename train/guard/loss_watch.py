"""What makes the guard act (`train.guard`): a loss judged against the run's own recent level.
Pure Python over numbers already on the host: nothing here reads a tensor.

    watch = LossWatch(window=128, sigma=6.0, min_rise=0.3)
    why = watch.see(step, loss)          # None, or why the run is in trouble
    watch.trouble_began()                # the first step of the excursion that ended in `why`

The recent level is the mean of the last `recent` losses; the noise is the standard deviation of
one step's loss around it, read from the differences of consecutive losses over the last `window`
(a falling loss, as early training's, does not count as noise: a spread of the values would).
A spike lies more than max(`sigma` x noise, `min_rise` nats) above the level; `patience` in a row
make trouble (early training has spikes that pass by themselves within a step or two). Until `min_history` losses are held there is no level yet: a loss a nat (`early_rise`)
above the first one (worse than the model at the start) is trouble. A non-finite loss always is.
Where the trouble began: a moving average of the loss is "calm" while within one noise of the
window's mean; the trouble began after the last calm step, so a loss that crept up for 40 steps
before it blew up is traced back to where the creeping started.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

__all__ = ["LossWatch"]


@dataclass
class LossWatch:
    window: int = 128  # losses the noise (and the calm band) are read from
    sigma: float = 6.0  # noises above the recent level that make a spike
    min_rise: float = 0.3  # nats: a spike is at least this far above the level
    patience: int = 2  # spikes in a row that make trouble (one that passes by itself is left alone)
    recent: int = 16  # losses the recent level is the mean of
    min_history: int = 16  # losses held before the level judges (before: the first loss does)
    early_rise: float = 1.0  # nats above the first loss that are trouble before there is a level
    ema: float = 0.1  # weight of the newest loss in the moving average that traces trouble back
    _losses: deque = field(default_factory=deque, repr=False)  # (step, loss) of the window, spikes left out
    _avg: float | None = None  # the moving average
    _calm: int | None = None  # the last step whose moving average was calm
    _first: tuple[int, float] | None = None  # the first (step, loss) seen
    _run: int = 0  # spikes in a row so far

    def noise(self) -> float:
        """The standard deviation of one step's loss, from consecutive differences over the window."""
        values = [v for _, v in self._losses]
        diffs = [(b - a) ** 2 for a, b in zip(values, values[1:])]
        return math.sqrt(math.fsum(diffs) / (2 * len(diffs))) if diffs else 0.0

    def see(self, step: int, loss: float) -> str | None:
        """Take the loss of `step`; why the run is in trouble now, or None."""
        if self._first is None:
            self._first = (step, loss)
        if not math.isfinite(loss):
            return f"the loss is {loss}"
        judged = len(self._losses) >= self.min_history
        spike = self._spike(loss) if judged else self._early(loss)
        self._run = self._run + 1 if spike else 0
        if judged:
            values = [v for _, v in self._losses]
            self._avg = loss if self._avg is None else self.ema * loss + (1 - self.ema) * self._avg
            if self._avg <= math.fsum(values) / len(values) + self.noise():
                self._calm = step
        elif spike is None:
            self._calm = step  # the first losses fall fast: calm unless already above the start
        if spike is None:  # a spike stays out of the level it is judged against
            self._losses.append((step, loss))
            while len(self._losses) > self.window:
                self._losses.popleft()
        return spike if self._run >= self.patience else None

    def _spike(self, loss: float) -> str | None:
        level = math.fsum(v for _, v in list(self._losses)[-self.recent:]) / min(self.recent, len(self._losses))
        noise = self.noise()
        if loss <= level + max(self.sigma * noise, self.min_rise):
            return None
        return f"a loss spike: {loss:.3f} against {level:.3f} (noise {noise:.3f} over the last {len(self._losses)} steps)"

    def _early(self, loss: float) -> str | None:
        first = self._first[1] if self._first and math.isfinite(self._first[1]) else math.inf
        if loss <= first + self.early_rise:
            return None
        return f"the loss rose to {loss:.3f}, above its first value {first:.3f}"

    def calm(self, step: int) -> bool:
        """Whether the run is calm at `step` (nothing seen yet counts as calm): a state to keep."""
        return self._first is None or self._calm is not None and self._calm >= step

    def trouble_began(self) -> int:
        """The first step of the trouble now seen: the step after the last calm one."""
        if self._calm is None:
            return self._first[0] if self._first is not None else 0
        return self._calm + 1

    def rewound(self, step: int) -> None:
        """The run went back to the state of `step`: forget what was seen after it (the level
        and the moving average start again from the losses before the trouble)."""
        self._losses = deque((s, v) for s, v in self._losses if s <= step)
        self._avg, self._run = None, 0
        self._calm = self._losses[-1][0] if self._losses else None
