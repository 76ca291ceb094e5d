"""The run doctor's rules on how the loss progresses: overfitting (the val loss rising while the
train loss falls) and plateaus (a loss that stopped moving). Same contract as `probes.doctor.rules_loss`."""

from __future__ import annotations

import math
import statistics

from probes.doctor.advice import decayed, lr_text
from probes.doctor.finding import MAKEMORE_SPLITS, Finding, NotChecked, rule
from probes.doctor.rules_loss import finite_series, loss_key, not_nats, overfit
from probes.doctor.run_history import RunHistory
from probes.doctor.thresholds import DoctorThresholds

__all__ = ["overfitting", "plateau"]

@rule("overfitting")
def overfitting(h: RunHistory, t: DoctorThresholds) -> list[Finding]:
    if h.loss_kind == "policy":
        raise not_nats(h, "whose held-out value does not measure memorising")
    found = overfit(h, t)
    if found is None:
        return []
    best_step, best, last, train_then, train_now = found
    snapshot = best_snapshot(h, dict(finite_series(h, "val_loss")))
    nats = " nats" if h.loss_kind == "cross_entropy" else ""
    return [Finding(
        "overfitting", "warning", f"val loss rose {last - best:.3f}{nats} from its best ({best:.3f} at "
        f"step {best_step}) while the train loss kept falling", step=best_step,
        where=("val loss",), evidence={"best_val_loss": best, "best_step": best_step, "last_val_loss": last,
                                       "train_loss_at_best": train_then, "train_loss_last": train_now,
                                       "best_snapshot": snapshot or "none saved near the best step"},
        cause="the model memorises the training text: what it learns stops carrying over to held-out text",
        fix=(f"use the best snapshot ({snapshot})" if snapshot else
             f"use ckpt.pt: with always_save_checkpoint = False nanoGPT saved it at the best val loss "
             f"(step {best_step})"
             if h.train_config("keeps_best") is True else f"keep the best weights ({h.flag('--save-every')})")
            + f"; regularise ({h.flag('--set dropout=0.2')}, weight decay) or train on more text",
        reference=MAKEMORE_SPLITS, page="overview")]


def best_snapshot(h: RunHistory, val_at: dict[int, float]) -> str | None:
    scored = [(val_at[s], s) for s in h.snapshot_steps if s in val_at]
    return f"step_{min(scored)[1]:06d}" if scored else None


def smoothed(series: list[tuple[int, float]], width: int = 5) -> list[tuple[int, float]]:
    """Each value as the median of it and the `width - 1` before it: one lucky batch of a noisy
    train loss is not a level the run reached."""
    return [(s, statistics.median(v for _, v in series[max(0, i - width + 1):i + 1]))
            for i, (s, _) in enumerate(series)]


@rule("plateau")
def plateau(h: RunHistory, t: DoctorThresholds) -> list[Finding]:
    if h.loss_kind == "policy":
        raise not_nats(h, "near 0 by construction: not judged for a plateau")
    key = loss_key(h, t.min_points)
    series = finite_series(h, key)
    if key == "train_loss":
        series = smoothed(series)
    try:
        if key == "val_loss" and overfit(h, t) is not None:
            return []  # its best eval came before the end: overfitting, not a plateau
    except NotChecked:
        pass
    nats = h.loss_kind == "cross_entropy"
    scale = 1.0 if nats else abs(series[0][1]) or 1.0  # scale-free: a fraction of the first value
    tolerance = t.plateau_nats if nats else t.plateau_relative * scale
    window = max(t.plateau_fraction * h.span, t.plateau_min_steps)
    found = final_plateau(series, window, tolerance, t.loss_rise if nats else t.rise_fraction * scale,
                          t.plateau_points)
    if found is None:
        return []
    start, end, level = found
    if abs(level) < 10 * tolerance:
        return []  # converged: a loss within ten tolerances of zero has nothing left to gain
    learned = series[0][1] - level
    stuck = learned < (t.not_learning_nats if nats else t.not_learning_fraction * scale)
    lr = h.lr_now()
    unit = " nats" if nats else f" ({t.plateau_relative:g} of its first value)"
    return [Finding(
        "plateau", "warning" if stuck else "info",
        f"the {key.replace('_', ' ')} has not improved by {tolerance:.3g}{unit} since step {start} "
        f"({end - start} steps)" + (" (it never left its initial value)" if stuck else ""), step=start,
        where=(key.replace("_", " "),),
        evidence={"loss_at_start": level, "plateau_steps": end - start, "window_steps": round(window),
                  "learned_before_nats" if nats else "learned_before": learned,
                  **({"lr": lr, "lr_peak": h.lr_peak()} if math.isfinite(lr) else {})},  # no "lr nan"
        cause="the updates are too small to move the loss" if stuck
              else "the loss has flattened at this learning rate",
        fix=f"raise the learning rate (it is {lr_text(lr)}; check the warmup and the schedule) and check "
            "that the targets are the next tokens" if stuck else flat_fix(h, t),
        reference=MAKEMORE_SPLITS, page="overview")]


def flat_fix(h: RunHistory, t: DoctorThresholds) -> str:
    """Decay the learning rate, unless the log shows it already decayed: then stop or scale up."""
    if decayed(h, t):
        return (f"stop here: the learning rate already decayed to {h.lr_now():.3g} ({h.lr_now() / h.lr_peak():.0%} "
                f"of its peak {h.lr_peak():.3g}), so more steps buy little; a larger model, more data or a longer "
                "context may")
    return (f"decay the learning rate ({h.flag('--schedule cosine')}) or stop here: more steps at this rate buy "
            "little; a larger model or context may")


def final_plateau(series: list[tuple[int, float]], window: float, tolerance: float,
                  rise: float, points: int = 3) -> tuple[int, int, float] | None:
    """(start, last step, best loss at start) of the stretch at the end of the run in which the
    best loss improved by less than `tolerance`, when it lasts at least `window` steps and `points`
    logged losses. A plateau the run has since left is history, and a loss climbing more than
    `rise` above its best is diverging: neither is a plateau."""
    values = [v for _, v in series]
    after = [math.inf] * (len(values) + 1)  # after[i]: the lowest loss from index i on
    for i in range(len(values) - 1, -1, -1):
        after[i] = min(values[i], after[i + 1])
    best = math.inf
    for i, (start, value) in enumerate(series):
        best = min(best, value)  # the best loss up to i; nothing after it gained `tolerance` on it
        if best - after[i + 1] < tolerance:
            stretch = values[i + 1:]
            flat = len(stretch) >= max(points - 1, 2) and max(stretch) - best < rise
            return (start, series[-1][0], best) if flat and series[-1][0] - start >= window else None
    return None
