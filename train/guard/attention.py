"""Attention that collapses fast, as the guard reads it (`train.guard`): pure functions over host numbers.

The series' first failure: at too high a rate a head's attention goes one-hot within a few dozen
steps (its entropy from near that of uniform attention to near 0), and the run plateaus far above
where it would have gone, often without a spike in the loss. A healthy head sharpens too, but
slowly: in the guard's development runs (two seeds, four recipes) no healthy head lost more than
0.34 of uniform attention's entropy between two readings 25 steps apart (one lost 0.62 over 50
steps), against 0.71-1.0 in every run whose rate was 10x to 100x too high.

A reading is {layer: [per-head series entropy, nats]} on the Monitor's eval tokens, taken every
`EVERY` steps. Each is divided by the entropy of uniform causal attention over the tokens'
positions (ln(n!) / n), so 1 is uniform and 0 one-hot.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

__all__ = ["COLLAPSED", "DROP", "EVERY", "Readings", "collapse", "normalized"]

EVERY = 25  # steps between readings: the drop below is per this many steps
COLLAPSED = 0.4  # a head below this fraction of uniform attention's entropy is collapsed ...
DROP = 0.5  # ... fast: it lost this fraction or more since the reading before (healthy runs: 0.34 at most)
SPAN = EVERY + EVERY // 2  # the most updates between two readings compared (a loop judging every 10 steps reads at 30)


def normalized(entropy: dict[str, list[Any]] | None, positions: int) -> dict[str, list[float]]:
    """Each head's entropy over that of uniform causal attention over `positions` (NaN where not finite)."""
    if not entropy or positions < 2:
        return {}
    uniform = math.lgamma(positions + 1) / positions
    return {str(layer): [float(h) / uniform if isinstance(h, (int, float)) and math.isfinite(h) else math.nan
                         for h in heads] for layer, heads in entropy.items()}


def collapse(readings: list[tuple]) -> tuple[int, str] | None:
    """(the step of the reading before, what collapsed in words), or None: the newest reading has a
    head below COLLAPSED that lost DROP or more of uniform's entropy per EVERY updates since the
    reading before it, at most SPAN updates before. `readings`: (step, normalized reading) or
    (step, normalized reading, updates applied before it: its place in the model's own history,
    which a restore sets back), oldest first."""
    if len(readings) < 2:
        return None
    (before_step, before, *was_at), (step, now, *now_at) = readings[-2], readings[-1]
    apart = (now_at[0] if now_at else step) - (was_at[0] if was_at else before_step)  # updates between them
    if apart > SPAN:
        return None
    drop = DROP * max(1.0, apart / EVERY)  # a fall judged per EVERY updates: slower than that is sharpening
    span = f"between steps {before_step} and {step}"
    if apart != step - before_step:  # a restore in between: the updates the attention had, not the steps
        span += f" ({apart} updates: a restore in between)"
    for layer, heads in now.items():
        was_heads = before.get(layer, [])
        for head, value in enumerate(heads):
            was = was_heads[head] if head < len(was_heads) else math.nan
            if value < COLLAPSED and was - value >= drop:
                return before_step, (f"head {head} of layer {layer} collapsed: its attention entropy fell from "
                                     f"{was:.2f} to {value:.2f} of uniform attention's {span}")
    return None


class Readings:
    """A guard's attention readings, one every EVERY steps (the newest `held`), and what the newest
    found collapsed. Each reading keeps its own step and its place in the model's history (updates
    before it): after a restore the run's steps go on while the model's history went back."""

    def __init__(self, held: int = 8):
        # (step, each head's entropy over uniform's, the updates the model had), oldest first
        self.held: deque = deque(maxlen=held)
        self.read_at: int | None = None  # the step of the last reading
        self.first_at: int | None = None  # the step of the first reading (the untrained model's)
        self.why: str | None = None  # what the newest reading found collapsed, in words
        self.behind: list[tuple[float, int]] = [(-math.inf, 0)]  # (from step, steps minus updates since)

    def due(self, step: int) -> bool:
        """Whether to read now (every EVERY steps, the first step seen included)."""
        return self.read_at is None or step - self.read_at >= EVERY

    def updates(self, step: int) -> int:
        """The updates the model had at `step` of the run (its step less those undone by restores before it)."""
        return step - next(b for since, b in reversed(self.behind) if since <= step)

    def see(self, step: int, entropy: dict[str, list[Any]] | None, positions: int) -> int | None:
        """Take a reading ({layer: [head entropy, nats]} on `positions` positions); the step of the
        reading before a fast collapse it shows (`collapse`), else None."""
        self.read_at = step
        reading = normalized(entropy, positions)
        if not reading:
            return None
        if self.first_at is None:
            self.first_at = step
        self.held.append((step, reading, self.updates(step)))
        found = collapse(list(self.held))
        self.why = found[1] if found else None
        return found[0] if found else None

    def restored(self, state_step: int, now: int) -> None:
        """The state of `state_step` went back in at `now`: the readings of its own history stay, with
        their steps; those taken after it are dropped; the next is `now - state_step` steps ahead of
        the model's updates more."""
        at = self.updates(state_step)
        self.held = deque([r for r in self.held if r[2] <= at], maxlen=self.held.maxlen)
        self.behind.append((now + 0.5, now - at))  # from the first update after the restore
        self.read_at = now
