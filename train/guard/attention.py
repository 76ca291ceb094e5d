"""Attention that collapses fast, as the guard reads it (`train.guard`): pure functions over host numbers.

The series' first failure: at too high a rate a head's attention goes one-hot within a few dozen
steps (its entropy from near that of uniform attention to near 0), and the run plateaus far above
where it would have gone, often without a spike in the loss. A healthy head sharpens too, but
slowly (in the guard's development runs no head lost more than a third of uniform attention's
entropy within 50 steps, against 0.7-1.0 in the runs whose rate was 10x to 1000x too high).

A reading is {layer: [per-head series entropy, nats]} on the Monitor's eval tokens, taken by the
guard at its snapshot steps (`every`). Each is divided by the entropy of uniform causal attention
over the tokens' positions (ln(n!) / n), so 1 is uniform and 0 one-hot.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

__all__ = ["COLLAPSED", "DROP", "Readings", "collapse", "normalized"]

COLLAPSED = 0.3  # a head below this fraction of uniform attention's entropy is collapsed ...
DROP = 0.6  # ... fast: it lost this fraction or more within `span` steps (healthy runs: a third at most)


def normalized(entropy: dict[str, list[Any]] | None, positions: int) -> dict[str, list[float]]:
    """Each head's entropy over that of uniform causal attention over `positions` (NaN where not finite)."""
    if not entropy or positions < 2:
        return {}
    uniform = math.lgamma(positions + 1) / positions
    return {str(layer): [float(h) / uniform if isinstance(h, (int, float)) and math.isfinite(h) else math.nan
                         for h in heads] for layer, heads in entropy.items()}


def collapse(readings: list[tuple[int, dict[str, list[float]]]], span: int) -> tuple[int, str] | None:
    """(the step of the newest reading before the collapse, what collapsed in words), or None: the
    newest reading has a head below COLLAPSED that stood DROP or more higher at a reading at most
    `span` steps before it. `readings`: (step, normalized reading), oldest first."""
    if len(readings) < 2:
        return None
    step, now = readings[-1]
    for before_step, before in reversed(readings[:-1]):
        if step - before_step > span:
            break
        for layer, heads in now.items():
            for head, value in enumerate(heads):
                was = before.get(layer, [])[head] if head < len(before.get(layer, [])) else math.nan
                if value < COLLAPSED and was - value >= DROP:
                    return before_step, (f"head {head} of layer {layer} collapsed: its attention entropy fell from "
                                         f"{was:.2f} to {value:.2f} of uniform attention's between steps "
                                         f"{before_step} and {step}")
    return None


class Readings:
    """A guard's attention readings, one every `every` steps (the newest `held`), and what the
    newest found collapsed."""

    def __init__(self, every: int, held: int = 8):
        self.every = every
        self.held: deque = deque(maxlen=held)  # (step, each head's entropy over uniform's), oldest first
        self.read_at: int | None = None  # the step of the last reading
        self.why: str | None = None  # what the newest reading found collapsed, in words

    def due(self, step: int) -> bool:
        """Whether to read now (every `every` steps, the first step seen included)."""
        return self.read_at is None or step - self.read_at >= self.every

    def see(self, step: int, entropy: dict[str, list[Any]] | None, positions: int) -> int | None:
        """Take a reading ({layer: [head entropy, nats]} on `positions` positions); the step of the
        newest reading before a fast collapse it shows (`collapse`, span 2 x `every`), else None."""
        self.read_at = step
        reading = normalized(entropy, positions)
        if not reading:
            return None
        self.held.append((step, reading))
        found = collapse(list(self.held), span=2 * self.every)
        self.why = found[1] if found else None
        return found[0] if found else None

    def restored(self, state_step: int, now: int) -> None:
        """The state of `state_step` went back in at `now`: its newest reading is the attention now."""
        kept = [r for s, r in self.held if s <= state_step][-1:]
        self.held = deque([(now, r) for r in kept], maxlen=self.held.maxlen)
        self.read_at = now
