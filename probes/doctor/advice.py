"""What the doctor advises, from what the log itself holds: the learning rate it logged (not only
the configured one), whether it had already decayed, and whether clipping was already on (the
Trainer, nanoGPT and llm.c clip at 1.0 unless told otherwise), so that it never advises what
the run already did."""

from __future__ import annotations

import math

from probes.doctor.run_history import RunHistory
from probes.doctor.thresholds import DoctorThresholds

__all__ = ["clip_advice", "decayed", "divergence_fix", "lr_text"]


def lr_text(lr: float) -> str:
    return f"{lr:g}" if math.isfinite(lr) else "not logged"


def decayed(h: RunHistory, t: DoctorThresholds) -> bool:
    """Whether the logged learning rate ended at a tenth of its peak or less (0 included)."""
    now, peak = h.lr_now(), h.lr_peak()
    return bool(h.logged_lr()) and math.isfinite(now) and peak > 0 and now <= t.lr_decayed * peak


def clip_advice(h: RunHistory) -> str:
    """Warmup, and clipping where the run's settings show it off or looser than 1.0 (or say nothing
    of it); where clipping was already on, what else to try."""
    clip = h.grad_clip()
    if clip is None:
        return f"add warmup, or gradient clipping if it is not on ({h.flag('--grad-clip 1.0')})"
    if clip == 0 or clip > 1.0:
        now = "off" if clip == 0 else f"at {clip:g}"
        return f"add warmup, or gradient clipping (it is {now}: {h.flag('--grad-clip 1.0')})"
    if h.trainer == "hf":  # a pretrained model's attention is not the user's to change
        return f"add warmup (warmup_ratio=0.1): clipping at {clip:g} is already on"
    return (f"add warmup, or normalise queries and keys ({h.flag('--set qk_norm=rms')}): clipping at {clip:g} "
            "is already on")


def divergence_fix(h: RunHistory) -> str:
    """Lower the learning rate (naming the one the run logged), then warmup and clipping or what
    else, where clipping was on."""
    lr = h.lr_peak()
    lower = f"lower the learning rate (it is {lr:g}; try 3-10x less)" if math.isfinite(lr) \
        else "lower the learning rate"
    if h.model.get("family") == "transformer" and h.model.get("norm") == "none":
        return f"normalise (RMSNorm before attention and MLP: --set norm=rms) and {lower}"
    return f"{lower}; {clip_advice(h)}"
