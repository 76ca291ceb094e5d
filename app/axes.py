"""Which axes a chart gets: pure decisions from the values it draws, no Streamlit, no Altair.

A diverged run's loss climbs from ~4 to ~10,000 nats: on a linear axis every other line lies flat
on the floor. So a y axis left on "auto" turns logarithmic when its finite values span more than
LOG_SPAN orders of magnitude (and are all positive: a log axis has no room for 0 or below), and
the chart says so. Small multiples of one figure (a chart per layer, per parameter group) share
one x range, padded so that a rule at the last step (a run's first NaN) is not drawn on the plot's
border.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

LOG_SPAN = 2.0  # orders of magnitude past which "auto" draws a log axis
Y_MODES = ("auto", "linear", "log")  # the y-axis control's choices
EDGE = 0.02  # of the x range, added past its last value


@dataclass(frozen=True)
class YAxis:
    log: bool
    note: str  # what the chart says about its axis ("" when the user chose it)


def finite(values: Iterable[object]) -> list[float]:
    """The finite numbers among `values` (None, NaN, inf and non-numbers dropped)."""
    return [float(v) for v in values
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]


def orders_spanned(values: Iterable[object]) -> float | None:
    """log10(largest / smallest) of the finite values, when all are positive; None when fewer than
    one is, or any is 0 or below (no log axis could draw it)."""
    numbers = finite(values)
    if not numbers or min(numbers) <= 0:
        return None
    return math.log10(max(numbers) / min(numbers))


def choose_y(values: Iterable[object], mode: str = "auto", prefer_log: bool = False) -> YAxis:
    """The y axis for `values` under the user's choice `mode` ("auto", "linear" or "log"). "auto"
    is log when the values span more than LOG_SPAN orders of magnitude, or when `prefer_log` (a
    learning rate: SGD's 0.05 beside Adam's 0.001) and some value is positive (the chart leaves
    those of 0 or below off)."""
    if mode not in Y_MODES:
        raise ValueError(f"y-axis mode must be one of {Y_MODES}, got {mode!r}")
    if mode != "auto":
        return YAxis(mode == "log", "")
    values = finite(values)
    if prefer_log and any(v > 0 for v in values):  # values of 0 or below are left off the axis
        return YAxis(True, "log y-axis")
    span = orders_spanned(values)
    if span is not None and span > LOG_SPAN:
        return YAxis(True, f"log y-axis: the values span {span:.1f} orders of magnitude")
    return YAxis(False, "")


def x_range(values: Iterable[object]) -> list[float] | None:
    """One x range for every chart of a figure: the finite values' extent, its end moved EDGE of
    the range further (1 for a single value) so that a rule at the last value is drawn inside the
    plot, not on its border; None without values."""
    numbers = finite(values)
    if not numbers:
        return None
    lo, hi = min(numbers), max(numbers)
    pad = (hi - lo) * EDGE or 1.0
    return [lo, hi + pad]
