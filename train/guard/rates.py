"""The rate a rewind sets, from the run's own evidence (`train.guard`).

- A rate blow-up: the rate that brings the update ratios (median rms(du)/rms(w) over the
  parameters, measured at the Monitor's log steps) to the top of their healthy band (1e-2): each
  calm measurement before the trouble gives one (its rate x 1e-2 / its ratio: an Adam or SGD step
  grows about in proportion to its rate), their median is taken; where none was measured, the
  rate at the last calm step cut by `cut`. Never above `cut` x the rate at which the trouble began.
- Attention collapsed fast (`attention`): the rate at the last reading where it was still spread,
  at most `cut` x the rate where it had collapsed.
- Once a rescued run is back and calm for `lift_after` steps: the cap doubled (`lift_plan`), never
  above half the rate that blew up, until it is gone.
- Trouble again under a cap, or a stall: the cap, cut by `cut` again (the ratios measured since the
  rewind were measured on its ramp, at rates that say nothing of what blew up).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

from train.guard.evidence import Evidence
from train.guard.kinds import U_TOP
from train.guard.plan import Plan, record
from train.guard.rate import RateCap, rate_of

__all__ = ["blowup_rate", "collapse_rate", "lift_plan"]


def applied_at(rates: Iterable[tuple[int, object]], began: int) -> tuple[float | None, float | None]:
    """(the rate of the last update before `began`, the rate of the first update from `began`), from
    the (step, rate applied) of recent updates."""
    before = [r for s, r in rates if s < began and r is not None]
    after = [r for s, r in rates if s >= began and r is not None]
    return (rate_of(before[-1]) if before else None), (rate_of(after[0]) if after else None)


def blowup_rate(rate: RateCap, rates: Iterable[tuple[int, object]], ratios: Iterable[tuple[int, float, object, bool]],
                cut: float, kind: str, began: int) -> tuple[float, str]:
    """(the new cap of the first param group, what evidence set it, in words), from the rate cap in
    force, the (step, rate applied) of recent updates and their (step, median update ratio, rate, calm)."""
    calm, trouble = applied_at(rates, began)
    asked = rate_of(rate.asked[0]) if rate.asked else None
    fallback = next((r for r in (calm, trouble, asked) if r is not None), 0.0)
    if kind == "stall":
        base = rate.cap if rate.cap is not None else fallback
        return base * cut, f"the cap {base:.3g} did not bring the loss back: x{cut:g}"
    if rate.cap is not None:  # trouble again under a cap: the ratios since the rewind were measured on its ramp
        return rate.cap * cut, f"the cap {rate.cap:.3g} it blew up under x{cut:g}"
    implied = [(rate_of(lr) * U_TOP / u, s) for s, u, lr, was_calm in ratios
               if s < began and was_calm and lr is not None and u > 0]  # the rate that puts each in the band
    if implied:  # an update ratio grows about in proportion to the rate (Adam's and SGD's steps alike)
        new = statistics.median(r for r, _ in implied)
        said = (f"{new:.3g}, the rate that brings its update ratios to the top of their band ({U_TOP:g}): the "
                f"median over {len(implied)} calm measurements (steps {implied[0][1]}-{implied[-1][1]})")
    else:
        new, said = fallback * cut, (f"the rate {fallback:.3g} at the last calm step x{cut:g} (no update ratios "
                                      "measured: log them with the Monitor)")
    top = trouble if trouble is not None else fallback
    if top > 0 and new > cut * top:
        new, said = cut * top, f"{said}; at most x{cut:g} the rate {top:.3g} at which the trouble began"
    return new, said


def collapse_rate(rate: RateCap, rates: Iterable[tuple[int, object]], cut: float, spread: int) -> tuple[float, str]:
    """(the new cap, in words) after attention collapsed between the reading at `spread` and now:
    the rate of the last update at or before `spread` (attention was still spread there), at most
    `cut` x the rate of the last update (where it had collapsed); under a cap already, the cap cut again."""
    if rate.cap is not None:
        return rate.cap * cut, f"the cap {rate.cap:.3g} it collapsed under x{cut:g}"
    spread_rates = [r for s, r in rates if s <= spread and r is not None]
    now = rate_of(rate.applied) if rate.applied is not None else None
    top = cut * now if now is not None else None
    if spread_rates:
        new = rate_of(spread_rates[-1])
        said = f"{new:.3g}, the rate at step {spread}, where its attention was still spread"
    else:
        new, said = (top or 0.0), f"x{cut:g} the rate {now:.3g} at which its attention collapsed"
    if top is not None and new > top:
        new, said = top, f"x{cut:g} the rate {now:.3g} at which its attention collapsed"
    return new, said


def lift_plan(run: Evidence, step: int, now: int) -> Plan | None:
    """A capped run calm for `lift_after` steps since it recovered: the cap doubled (or gone)."""
    s, cap = run.settings, run.rate.cap
    if cap is None or run.calm_from is None or step - run.calm_from < s.lift_after:
        return None
    ceiling = 0.5 * run.unsafe if run.unsafe is not None else math.inf
    new = min(2 * cap, ceiling)
    peak = run.rate.peak()
    if new <= cap * (1 + 1e-9):
        run.calm_from = None  # as high as the evidence allows: stays
        return None
    gone = peak is not None and new >= peak
    why = f"calm for {step - run.calm_from} steps at the cap {cap:.3g}"
    rate_from = "the cap doubled" + (f", never above half the rate {run.unsafe:.3g} that blew up"
                                     if new == ceiling else "")
    last = next((r for r in reversed(run.rescues) if r["action"] in ("rewind",)), None)
    kind = last["kind"] if last else "rate_blowup"
    rec = record(kind, run._said("lift"), why, step, run.acts, None, now, cap=None if gone else new,
                 factor=None, rate_from=rate_from)
    run.calm_from = step
    return Plan(now, rec, None, None if gone else new, step)
