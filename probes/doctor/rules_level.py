"""The run doctor's rules on where the loss sits, not how it moves: a model whose loss stays at
ln(vocab) learns nothing (a uniform guess scores exactly that), and a gradient norm that went
non-finite for a step while the losses around it stayed finite is a step the loss scaler skipped,
not a divergence."""

from __future__ import annotations

import math

from probes.doctor.finding import MAKEMORE_INIT, Finding, NotChecked, rule
from probes.doctor.rules_loss import ended, finite_series, loss_key, not_nats
from probes.doctor.run_history import RunHistory
from probes.doctor.signals import skipped_steps
from probes.doctor.thresholds import DoctorThresholds

__all__ = ["learned", "skipped", "uniform_key", "uniform_loss"]

MIXED_PRECISION = "PyTorch AMP: GradScaler skips optimizer.step() when the scaled gradients hold inf or NaN"


@rule("uniform_loss")
def uniform_loss(h: RunHistory, t: DoctorThresholds) -> list[Finding]:
    """The loss never went `uniform_margin` of ln(vocab) (or `not_learning_nats`) below it after
    its first value, and ends near it (not above by `loss_rise`: that is the divergence rule's):
    failed when the run ended there, a warning while it goes on."""
    d_vocab = h.model.get("d_vocab")
    if not isinstance(d_vocab, int) or d_vocab < 2:
        raise h.not_logged("vocab size", "no d_vocab in run.json or a snapshot's config.json")
    if h.loss_kind != "cross_entropy":
        raise not_nats(h, "so not against ln(vocab)")
    key = uniform_key(h, t)
    series = finite_series(h, key)
    uniform = math.log(d_vocab)
    best_step, best = min(series[1:], key=lambda sv: sv[1])
    last = series[-1][1]
    if best < uniform - max(t.not_learning_nats, t.uniform_margin * uniform) or last > uniform + t.loss_rise:
        return []
    done = ended(h)
    name = key.replace("_", " ")
    return [Finding(
        "uniform_loss", "failed" if done else "warning",
        f"the {name} never went below ln({d_vocab}) = {uniform:.2f}: best {best:.2f} at step {best_step}, "
        f"last {last:.2f}" + ("" if done else " (the run goes on)"), step=series[0][0], where=(name,),
        evidence={"first_loss": series[0][1], "best_loss": best, "best_step": best_step, "last_loss": last,
                  "ln_vocab": uniform, "below_uniform_nats": uniform - best, "points": len(series),
                  "lr": h.lr_now()},
        cause="the model predicts no better than a uniform guess over its vocabulary: it learned nothing "
              "(the learning rate is too small or zero, the gradients do not reach the weights, or the "
              "targets do not follow from the inputs)",
        fix="check that the loss is computed on the next tokens and that optimizer.step() updates the weights "
            f"(the learning rate is {h.lr_now():g})" if math.isfinite(h.lr_now()) else
            "check that the loss is computed on the next tokens and that optimizer.step() updates the weights",
        reference=MAKEMORE_INIT, page="overview")]


def uniform_key(h: RunHistory, t: DoctorThresholds) -> str:
    """The loss to judge: loss_key's, or with fewer points than it needs, one logged at two steps
    `uniform_min_steps` apart at least (a loss still at ln(vocab) that late is stuck at any count)."""
    try:
        return loss_key(h, t.min_points)
    except NotChecked:
        for key in ("val_loss", "train_loss"):
            series = finite_series(h, key)
            if len(series) >= 2 and series[-1][0] - series[0][0] >= t.uniform_min_steps:
                return key
        raise NotChecked(f"not enough data: fewer than {t.min_points} logged losses, "
                         f"and none {t.uniform_min_steps} steps after the first") from None


def learned(h: RunHistory, t: DoctorThresholds) -> str:
    """'the val loss fell 59x (0.47 -> 0.008)' when a loss fell `learned_fold` from its first value
    to its last (learning, however few the points); '' otherwise, or for a policy loss."""
    if h.loss_kind == "policy":
        return ""
    for key in ("val_loss", "train_loss"):
        series = finite_series(h, key)
        if len(series) >= 2 and series[-1][1] > 0 and series[0][1] >= t.learned_fold * series[-1][1]:
            first, last = series[0][1], series[-1][1]
            return f"the {key.replace('_', ' ')} fell {first / last:.0f}x ({first:.3g} -> {last:.3g})"
    return ""


@rule("skipped_steps")
def skipped(h: RunHistory, t: DoctorThresholds) -> list[Finding]:
    """Steps with a non-finite gradient norm between finite ones, the losses finite: an info."""
    if not h.series("grad_norm"):
        raise h.not_logged("gradient norm", "no grad_norm in metrics.jsonl")
    steps = skipped_steps(h)
    if not steps:
        return []
    shown = ", ".join(map(str, steps[:5])) + (f" and {len(steps) - 5} more" if len(steps) > 5 else "")
    return [Finding(
        "skipped_steps", "info", f"{len(steps)} step{'s' if len(steps) > 1 else ''} with a non-finite gradient "
        f"norm and finite losses around {'them' if len(steps) > 1 else 'it'} (at step {shown}): skipped, "
        "not diverged", step=steps[0], where=("gradient norm",),
        evidence={"skipped": len(steps), "steps": shown, "of_logged_norms": len(h.series("grad_norm"))},
        cause="a mixed-precision loss scaler found inf/NaN gradients, skipped that update and lowered its "
              "scale; the weights were untouched and the run went on",
        fix="", reference=MIXED_PRECISION, page="dynamics")]
