"""Events in a run's loss history that tell the divergence rule from the overfitting rule, read from
the records alone: the learning rate stepping up where the loss turned (a schedule bug, a rate in the
wrong unit: the cause, and its step), and a val loss jumping several nats in one eval (weights
thrown off, which memorising never does)."""

from __future__ import annotations

from probes.doctor.run_history import RunHistory
from probes.doctor.thresholds import DoctorThresholds

__all__ = ["RATE_JUMP", "rate_jump", "val_jump"]


RATE_JUMP = 2.0  # a logged learning rate this many times the one logged before it: a step, not a schedule


def rate_jump(h: RunHistory, series: list[tuple[int, float]], start: int, rise: float) -> tuple[int, float, float] | None:
    """(step, lr before, lr after) of the last step up of the logged learning rate (RATE_JUMP or
    more from one record to the next) at or before `start`, where the loss rose past its best, and
    after the loss had learned (fallen `rise` below its first value: a warmup's ramp, which also
    doubles the rate from record to record, comes before that); None where there is none."""
    logged = h.logged_lr()
    first = series[0][1]
    learned = next((s for s, v in series if v <= first - rise), None)
    if learned is None:
        return None
    jumps = [(s, before, after) for (_, before), (s, after) in zip(logged, logged[1:])
             if learned < s <= start and before > 0 and after >= RATE_JUMP * before]
    return jumps[-1] if jumps else None


def val_jump(h: RunHistory, t: DoctorThresholds, val: list[tuple[int, float]], best_step: int) -> bool:
    """A val loss that jumped several nats (`spike_nats`) between two evals after its best: a run whose
    weights were thrown off (a rate x170: 2.3 -> 9.0 in one eval), which no memorising does (a
    model fitting its training text drifts from held-out text: hf_overfit's val rose at most 1.1
    nats an eval, 4.5 -> 9.5 over eight)."""
    if h.loss_kind != "cross_entropy":
        return False
    return any(after - before >= t.spike_nats for (_, before), (s, after) in zip(val, val[1:]) if s > best_step)
