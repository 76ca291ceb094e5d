"""The run doctor's rules on the losses and the gradient norm: the initial loss, divergence (and
what grew before it) and gradient spikes (overfitting and plateaus: `probes.doctor.rules_progress`). Each rule takes a RunHistory and
the thresholds and returns findings, or raises NotChecked saying why it could not look."""

from __future__ import annotations

import math
import statistics
from typing import Any

from probes.doctor.advice import clip_advice, divergence_fix, lr_text
from probes.doctor.finding import (MAKEMORE_INIT, PASCANU, SERIES_RMSNORM, WORTSMAN, Finding,
                                   NotChecked, rule)
from probes.doctor.log_file import LOSS_KINDS
from probes.doctor.loss_events import rate_jump, val_jump
from probes.doctor.rescues import last_weights_reset
from probes.doctor.run_history import RunHistory, as_float, is_finite
from probes.doctor.rescues import rewound
from probes.doctor.signals import first_nonfinite, growth_signals, max_group_log10_u, max_value
from probes.doctor.thresholds import DoctorThresholds

__all__ = ["divergence", "ended", "finite_series", "grad_spike", "init_loss", "loss_key", "not_nats"]


def finite_series(h: RunHistory, key: str) -> list[tuple[int, float]]:
    return [(s, v) for s, v in h.series(key) if math.isfinite(v)]


def loss_key(h: RunHistory, min_points: int = 3) -> str:
    """val_loss where enough evals were logged (fixed batches: only the weights move it), else
    the train loss; NotChecked when neither has `min_points` finite values."""
    for key in ("val_loss", "train_loss"):
        if len(finite_series(h, key)) >= min_points:
            return key
    raise NotChecked(f"not enough data: fewer than {min_points} logged losses")


def not_nats(h: RunHistory, judged: str) -> NotChecked:
    """A rule in nats on a loss that is not a cross-entropy: say what the loss is and why."""
    return NotChecked(f"not judged: the loss is {LOSS_KINDS[h.loss_kind]} ({h.loss_kind_why}), {judged}")


def ended(h: RunHistory) -> bool:
    """Whether the last record is the run's end: its planned last step was reached, or no plan is
    known and the history was not cut (--step); a run known to be still going has not ended."""
    steps = h.train_config("steps")
    if h.upto is not None:
        return False
    # `steps` steps counted from 0 end at step steps - 1 (a Monitor's loop); ours log step == steps
    return h.last_step >= steps - 1 if isinstance(steps, int) and steps > 0 else True


# ------------------------------------------------------------------ the initial loss

@rule("init_loss_high")
def init_loss(h: RunHistory, t: DoctorThresholds) -> list[Finding]:
    d_vocab = h.model.get("d_vocab")
    if not isinstance(d_vocab, int) or d_vocab < 2:
        raise h.not_logged("vocab size", "no d_vocab in run.json or a snapshot's config.json")
    if h.loss_kind != "cross_entropy":
        raise not_nats(h, "so not against ln(vocab)")
    start, key, which = initial_loss(h)
    loss = as_float(start[key])
    if not math.isfinite(loss):
        return []  # the divergence rule reports a loss that is non-finite from the start
    expected = math.log(d_vocab)
    excess = loss - expected
    if excess <= t.init_excess_info:
        return []
    return [Finding(
        "init_loss_high", "warning" if excess > t.init_excess_warning else "info",
        f"initial loss {loss:.2f} ({which}) is {excess:.2f} nats above ln({d_vocab}) = {expected:.2f}",
        step=start["step"], where=("output logits at init",),
        evidence={"initial_loss": loss, "measured": which, "expected_ln_vocab": expected, "excess_nats": excess},
        cause="the logits at init are far from zero, so the model starts confidently wrong and its "
              "first steps are spent shrinking them (makemore's hockey-stick loss)",
        fix=f"initialise the output layer small ({h.flag('--set unembed_init_scale=0.01')}: its weights "
            "x 0.01, its bias zero) so the first predictions are near uniform",
        reference=MAKEMORE_INIT, page="overview")]


def initial_loss(h: RunHistory) -> tuple[dict[str, Any], str, str]:
    """(record, key, what it is) of the loss before any update: the train loss at step 0 (the
    first batch's loss, computed before its step; an eval logged at step 0 may come after that
    step, as a Monitor's loop measures it), else the val loss at step 0, else the train loss at
    step 1 where every step is logged (the first step of a loop counting from 1)."""
    at = {(r["step"], k): r for r in h.records for k in ("train_loss", "val_loss") if k in r and r["step"] <= 1}
    if (0, "train_loss") in at:
        return at[0, "train_loss"], "train_loss", "the train loss at step 0, before any update"
    if (0, "val_loss") in at:
        return at[0, "val_loss"], "val_loss", "the val loss at step 0"
    if (1, "train_loss") in at and h.train_config("log_every") == 1:
        return at[1, "train_loss"], "train_loss", "the train loss at step 1, the first logged"
    raise NotChecked("not enough data: no loss logged at step 0")


# ------------------------------------------------------------------ divergence

@rule("divergence")
def divergence(h: RunHistory, t: DoctorThresholds) -> list[Finding]:
    bad = first_nonfinite(h)
    limit = bad[0] if bad else None
    signals = growth_signals(h, t, before=limit)
    if bad is None:
        return rising_loss(h, t, signals)
    step, what = bad
    warning = signals[0] if signals and signals[0][0] < step else None
    evidence: dict[str, Any] = {"first_nonfinite_step": step, "nonfinite": "; ".join(what)}
    if warning:
        evidence.update({"grew_first": warning[1], "grew_first_step": warning[0],
                         "grew_first_by": warning[2], "steps_of_warning": step - warning[0]})
    evidence["then"] = "; ".join(f"{label} at step {s} ({by})" for s, label, by in signals[1:4]) or "-"
    evidence.update(before_failure(h, step))
    first_losses = [h.records[0].get(k) for k in ("train_loss", "val_loss")]
    if step == h.first_step and step <= 1 and not any(map(is_finite, first_losses)):
        return [Finding(  # the loss of a forward pass before any update: not the learning rate's doing
            "divergence", "failed", f"the loss is non-finite from the first step ({what[0]} at step {step})",
            step=step, where=tuple(what), evidence=evidence,
            cause="the first loss is computed before any update, so the learning rate did not do it: the "
                  "inputs, the initial or loaded weights, or the precision (fp16 overflowing) did",
            fix="check that the input tokens lie inside the vocabulary, that the weights loaded are finite, "
                "and run a step in fp32 to see whether the precision is the cause",
            reference=f"{SERIES_RMSNORM}; {WORTSMAN}", page="dynamics")]
    return [Finding(
        "divergence", "failed", f"the run diverged: {what[0]} at step {step}", step=step,
        warning_step=warning[0] if warning else None, where=tuple(what), evidence=evidence,
        cause="activations or weights grew until they overflowed"
              + (f"; the first sign was the {warning[1]} at step {warning[0]}" if warning else ""),
        fix=divergence_fix(h), reference=f"{SERIES_RMSNORM}; {WORTSMAN}", page="dynamics")]


def rising_loss(h: RunHistory, t: DoctorThresholds, signals: list[tuple[int, str, str]]) -> list[Finding]:
    """No NaN yet, but a loss (the train loss, else the val loss: a coarse log may first see the
    train loss already blown up, the val loss at step 0 did not) climbed a nat above its best so
    far and is still there: a warning; a failure when the run ended (its last planned step) above
    its first value. A run still going, or cut, is warned: NaN is its failure."""
    if h.loss_kind == "policy":
        return []  # near 0 by construction, either sign: only NaN says it diverged
    for key in ("train_loss", "val_loss"):
        if key == "val_loss" and memorising(h, t):
            continue  # the overfitting rule's: the model fits its training text better than it ever did held-out text
        found = rise_in(h, t, signals, key, finite_series(h, key))
        if found:
            return found
    return spike_in(h, t, "train_loss") or spike_in(h, t, "val_loss")


def spike_in(h: RunHistory, t: DoctorThresholds, key: str) -> list[Finding]:
    """A loss that climbed far above its first value (`spike_nats`) and came back below that line:
    no NaN and no rise left at the end, yet the run nearly diverged (a warning). A run the guard
    rewound has its `rescued` findings for that: its blow-up is not told twice."""
    if any(rewound(r) for r in h.records):
        return []
    series = [(r["step"], v) for r in h.records if key in r and math.isfinite(v := as_float(r[key]))]
    if len(series) < 3:
        return []
    first, name = series[0][1], key.replace("_", " ")
    line = first + (t.spike_nats if h.loss_kind == "cross_entropy" else t.spike_fraction * abs(first))
    above = [(s, v) for s, v in series[1:] if v > line]
    if not above:
        return []
    peak_step, peak = max(above, key=lambda sv: sv[1])
    back = next(((s, v) for s, v in series if s > peak_step and v <= line), None)
    if back is None:
        return []  # still up there at the end: rise_in's (or the run is short of points to say)
    last_step, last = series[-1]
    return [Finding(
        "divergence", "warning", f"the {name} spiked: {first:.2f} at step {series[0][0]} -> {peak:.2f} at step "
        f"{peak_step}, back to {back[1]:.2f} by step {back[0]} (it ended at {last:.2f})", step=above[0][0],
        where=(name,),
        evidence={"first_loss": first, "peak_loss": peak, "peak_step": peak_step, "back_step": back[0],
                  "last_loss": last, "spike_nats": peak - first},
        cause="the updates were too large for the loss surface: steps overshot far enough to lose what the "
              "model knew, and it had to learn again (a larger spike is a divergence)",
        fix=divergence_fix(h), reference=f"{SERIES_RMSNORM}; {WORTSMAN}", page="dynamics")]


def memorising(h: RunHistory, t: DoctorThresholds) -> bool:
    """The val loss rose while the train loss fell below the best val loss: overfitting, however far
    the val loss climbs (a train loss blown up above where the val loss began is no such thing)."""
    try:
        found = overfit(h, t)
    except NotChecked:
        return False
    return found is not None and found[4] < found[1]


def rise_in(h: RunHistory, t: DoctorThresholds, signals: list[tuple[int, str, str]], key: str,
            series: list[tuple[int, float]]) -> list[Finding]:
    if len(series) < 2:
        return []
    best_step, best = min(series[:-1], key=lambda sv: sv[1])
    last_step, last = series[-1]
    first, name = series[0][1], key.replace("_", " ")
    # a cross-entropy in nats; any other loss by a fraction of its first value (scale-free)
    rise = t.loss_rise if h.loss_kind == "cross_entropy" else t.rise_fraction * abs(first)
    if last - best < rise or last_step <= best_step:
        return []
    start = next(s for s, v in series if s > best_step and v - best >= rise)
    event = rate_jump(h, series, start, rise)  # the rate stepped up before the loss turned: the cause, and its step
    warning = event[0] if event else signals[0][0] if signals else start
    d_vocab = h.model.get("d_vocab")
    uniform = math.log(d_vocab) if isinstance(d_vocab, int) and d_vocab > 1 and h.loss_kind == "cross_entropy" \
        else math.inf
    # back at the untrained model's level (within the uniform rule's margin of ln(vocab)): destroyed
    untrained = uniform - t.uniform_margin * uniform
    lost_all = ended(h) and (last > first or last > untrained)
    above = f"its first value {first:.2f}" if last > first else \
        f"ln({d_vocab}) = {uniform:.2f}, a uniform guess" if last > uniform else \
        f"the untrained model's level, ln({d_vocab}) = {uniform:.2f}"
    title = (f"the run diverged: the {name} ended at {last:.2f} (step {last_step}), "
             f"{'above' if last > uniform or last > first else 'back at'} {above} "
             f"(best {best:.2f} at step {best_step})") if lost_all else \
        f"the {name} is rising: {best:.2f} at step {best_step} -> {last:.2f} at step {last_step}"
    rate = {"lr_jump_step": event[0], "lr_before": event[1], "lr_after": event[2]} if event else {}
    return [Finding(
        "divergence", "failed" if lost_all else "warning", title, step=event[0] if event else start,
        warning_step=min(warning, start), where=(name,),
        evidence={"first_loss": first, "best_loss": best, "best_step": best_step, "last_loss": last,
                  "rise_nats": last - best, **rate,
                  "signals": "; ".join(f"{label} at step {s} ({by})" for s, label, by in signals[:4]) or "-",
                  **before_failure(h, last_step + 1)},
        cause=(f"the learning rate went from {event[1]:.3g} to {event[2]:.3g} (x{event[2] / event[1]:.3g}) at "
               f"step {event[0]}, where the loss turned: the updates became too large for the loss surface"
               if event else "the updates are too large for the loss surface: each step overshoots"),
        fix=divergence_fix(h), reference=f"{SERIES_RMSNORM}; {WORTSMAN}", page="dynamics")]


def before_failure(h: RunHistory, step: int) -> dict[str, Any]:
    """The last finite gradient norm, largest group update ratio and residual rms before `step`."""
    out: dict[str, Any] = {}
    earlier = [r for r in h.records if r["step"] < step]
    for label, value in (("grad_norm_before", lambda r: as_float(r.get("grad_norm"))),
                         ("max_log10_u_before", lambda r: max_group_log10_u(h, r)),
                         ("resid_rms_before", lambda r: max_value(r.get("resid_rms")))):
        found = [(r["step"], v) for r in earlier if math.isfinite(v := value(r))]
        if found:
            out[label] = found[-1][1]
    return out


def overfit(h: RunHistory, t: DoctorThresholds) -> tuple[int, float, float, float, float] | None:
    """(best step, best val loss, last val loss, train loss at best, last train loss) when the val
    loss rose `overfit_rise` above its best while the train loss kept falling; else None."""
    val, train = finite_series(h, "val_loss"), finite_series(h, "train_loss")
    reset = last_weights_reset(h)
    if reset is not None:  # the guard put earlier weights back: a val loss from before is another run's
        val, train = [(s, v) for s, v in val if s > reset], [(s, v) for s, v in train if s > reset]
    if len(val) < 3:
        since = f" since the guard's rewind at step {reset}" if reset is not None else ""
        raise NotChecked(f"not enough data{since}: fewer than 3 eval steps with a val loss")
    best_step, best = min(val, key=lambda sv: sv[1])
    last = val[-1][1]
    if val_jump(h, t, val, best_step):
        return None  # the divergence rule's, never memorising
    train_then = [v for s, v in train if s <= best_step] or [v for s, v in train[:1]]
    train_now = train[-1][1] if train else math.nan
    if last - best < t.overfit_rise or not train_then or not train_now < train_then[-1]:
        return None
    return best_step, best, last, train_then[-1], train_now


# ------------------------------------------------------------------ gradient spikes

@rule("grad_spike")
def grad_spike(h: RunHistory, t: DoctorThresholds) -> list[Finding]:
    norms = [(s, v) for s, v in h.series("grad_norm")]
    if not norms:
        raise h.not_logged("gradient norm", "no grad_norm in metrics.jsonl")
    if len(norms) < 4:
        raise NotChecked("not enough data: fewer than 4 logged gradient norms")
    spikes = []
    finite = [(i, v) for i, (_, v) in enumerate(norms) if math.isfinite(v)]
    # the recent median, floored by the median of the first norms: as a classifier's loss falls to
    # 1e-4 its recent median falls to 1e-3, and ordinary norms of 3 would read as thousand-fold spikes
    floor = statistics.median(v for _, v in finite[:20]) if finite else 0.0
    for k, (i, value) in enumerate(finite):
        recent = [v for _, v in finite[max(0, k - 20):k]]
        if len(recent) >= 3:
            scale = max(statistics.median(recent), floor)
            if value > t.grad_spike * scale:
                spikes.append((norms[i][0], value, value / scale))
    if not spikes:
        return []
    worst = max(spikes, key=lambda s: s[2])
    return [Finding(
        "grad_spike", "warning", f"{len(spikes)} gradient-norm spike{'s' if len(spikes) > 1 else ''}, "
        f"the first at step {spikes[0][0]} ({spikes[0][2]:.0f}x the typical norm before it)", step=spikes[0][0],
        where=("gradient norm",),
        evidence={"spikes": len(spikes), "first_spike_step": spikes[0][0], "largest_ratio": worst[2],
                  "largest_at_step": worst[0], "largest_norm": worst[1]},
        cause="a batch or a weight configuration produced a gradient far larger than usual; one such "
              "step can throw the weights out of their basin",
        fix=f"lower the learning rate (it is {lr_text(h.lr_peak())}); {clip_advice(h)}",
        reference=PASCANU, page="dynamics")]

