"""The plans of a guard's rescues (`train.guard.run`): a skip back to the state before bad batches,
a rewind before a rate's damage with a rate from the evidence (`rates`), or a stop past the floor."""

from __future__ import annotations

from typing import Callable

from train.guard.evidence import Evidence
from train.guard.plan import Plan, record
from train.guard.rate import rate_of
from train.guard.rates import blowup_rate, collapse_rate

__all__ = ["rate_plan", "skip_plan"]


def skip_plan(run: Evidence, why: str, began: int, bad: list[int], now: int, refused: bool = False) -> Plan:
    """Restore the newest state taken before the first bad batch; keep the rate. `refused`: their
    updates were never taken (`GuardedRun.refuse`): nothing to restore."""
    if refused:
        rec = record("data_spike", "refuse", why, began, run.acts, None, now, cap=run.rate.cap,
                     rate_from="the rate kept: bad batches say nothing about it", skipped_steps=bad)
        return Plan(now, rec, None, None, began)
    good = [slot for slot in run._held() if slot.step < began]
    slot = max(good, key=lambda x: x.step) if good else None
    action = run._said("skip" if slot is not None else "none")
    if slot is None:
        why += "; no calm state held before them, so they stay"
    rec = record("data_spike", action, why, began, run.acts, slot, now, cap=run.rate.cap,
                 rate_from="the rate kept: bad batches say nothing about it", skipped_steps=bad)
    return Plan(now, rec, slot, None, began)

def rate_plan(run: Evidence, kind: str, why: str, step: int, now: int, warned: Callable | None,
               began: int | None = None, newest: int | None = None) -> Plan:
    """Rewind before the damage with a rate from the evidence, or stop past the floor. `newest`:
    the newest state known good (an attention collapse: its last spread reading); else the one
    before the step before `began` (the loss of the step after it was calm)."""
    s = run.settings
    collapsed = newest is not None
    began = run.watch.trouble_began() if began is None else began
    extra = warned(began) if warned is not None else None
    warning = None
    if extra is not None and extra[0] < began:
        began, warning = extra[0], f"{extra[1]} at step {extra[0]}"
        why = f"{why} (the doctor warned of {warning})"
    held = run._held()
    if kind == "stall":  # an earlier state than the one that stalled
        older = [x for x in held if run.last_restored is None or x.step < run.last_restored.step]
        slot = max(older, key=lambda x: x.step) if older else min(held, key=lambda x: x.step, default=None)
    else:
        newest = began - 2 if newest is None or warning is not None else newest  # the step after it was calm
        good = [x for x in held if x.step <= newest]
        slot = max(good, key=lambda x: x.step) if good else min(held, key=lambda x: x.step, default=None)
    cap, rate_from = (collapse_rate(run.rate, run.rates, s.cut, began - 1) if collapsed else
                      blowup_rate(run.rate, run.rates, run.ratios, s.cut, kind, began))
    asked = rate_of(run.rate.asked[0]) if run.rate.asked else cap
    if run.first_rate is None:
        run.first_rate = rate_of(run.rate.applied) if run.rate.applied is not None else asked
    number = run.acts + 1
    stop = slot is None or number > s.max_rescues or cap < s.floor * run.first_rate
    if stop:
        why += "; " + ("no state held to go back to" if slot is None else
                       f"rescue {number} is past max_rescues ({s.max_rescues})" if number > s.max_rescues else
                       f"the rate {cap:.3g} would be below the floor ({s.floor:g} x {run.first_rate:.3g})")
        slot = slot if slot is not None else None
        rec = record(kind, run._said("stop"), why, began, number, slot, now, cap=run.rate.cap,
                     rate_from=rate_from)
        rec["restored_step"] = None if slot is None else slot.step
        return Plan(now, rec, slot, None, began)
    factor = min(1.0, cap / asked) if asked > 0 else 1.0
    rec = record(kind, run._said("rewind"), why, began, number, slot, now, cap=cap, factor=factor,
                 rate_from=rate_from)
    if warning is not None:
        rec["warned"] = warning
    level = run.recovery.target if run.recovery is not None else run.watch.level()
    level = level if level is not None else run.watch.best  # before the run has a level: its best so far
    return Plan(now, rec, slot, cap, began, target=level, unsafe=unsafe_rate(run, kind, began, collapsed))

def unsafe_rate(run: Evidence, kind: str, began: int, collapsed: bool) -> float | None:
    """The rate a rescue learns is too high: the one that collapsed the attention (the last
    update's), or that of the first update of a rate blow-up; none for a stall."""
    if collapsed:
        return rate_of(run.rate.applied) if run.rate.applied is not None else None
    first = next((r for s_, r in run.rates if s_ >= began), None) if kind == "rate_blowup" else None
    return rate_of(first) if first is not None else None
