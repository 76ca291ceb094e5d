"""What the guard (`train.guard`) did to a run, as the doctor reports it: each rescue a finding
("rescued at step N: ..."), a stop a failure, a watching guard's "would rescue" a warning; and the
structural fix it names, since a rescued run still had its rate (or its model) wrong.

A record the guard rewound holds the bad loss of its step (it is the truth of that step) and a
`rescue` entry: {action, trigger, trouble_began, restored_step, number, lr_cap, factor, skipped}.
Such a step is no divergence: the run went on from an earlier state (`rewound`).
"""

from __future__ import annotations

import math
from typing import Any

from probes.doctor import flags
from probes.doctor.finding import WORTSMAN, Finding, rule
from probes.doctor.run_history import RunHistory
from probes.doctor.thresholds import DoctorThresholds

__all__ = ["PALM", "no_qk_advice", "rescues", "rewound", "stopped", "structural_fix"]

PALM = "Chowdhery et al. 2022, PaLM: restarting about 100 steps before a spike and skipping 200-500 batches"


def rewound(record: dict[str, Any]) -> bool:
    """A record whose step the guard rewound (its non-finite values are not where the run ended)."""
    rescue = record.get("rescue")
    return isinstance(rescue, dict) and rescue.get("action") == "rewind"


def stopped(record: dict[str, Any]) -> bool:
    """A record at which the guard stopped the run (after its rescues, or with none to go back to)."""
    rescue = record.get("rescue")
    return isinstance(rescue, dict) and rescue.get("action") == "stop"


def structural_fix(lr_cap: float | None, trainer: str = flags.OURS, qk_norm: bool = False,
                   stopped: bool = False) -> str:
    """What to change so that the run needs no rescue: the peak rate the guard settled on (below
    it, when the run relapsed there and was `stopped`), QK-norm (unless `qk_norm`: the model has it,
    or has no attention), the sweep that finds the rate."""
    known = lr_cap is not None and math.isfinite(lr_cap)
    rate = ("lower the peak learning rate" if not known else
            f"lower the peak learning rate below {lr_cap:.3g} (it relapsed even capped there)" if stopped else
            f"lower the peak learning rate to about {lr_cap:.3g} (where the guard capped it)")
    norm = "" if qk_norm else f", normalise queries and keys ({flags.flag('--set qk_norm=rms', trainer)})"
    sweep = "python -m train.sweep --lr ..." if trainer == flags.OURS else "a learning-rate sweep"
    return f"{rate}{norm}; {sweep} finds the highest rate that trains without rescue"


def no_qk_advice(model: dict[str, Any]) -> bool:
    """A model (as run.json says it) that has QK-norm already, or no attention heads we know of."""
    return model.get("qk_norm") not in (None, "none") or not model.get("n_heads")


@rule("rescued", "guard_stopped", "guard_would_rescue")
def rescues(h: RunHistory, t: DoctorThresholds) -> list[Finding]:
    """One finding per record the guard wrote: a rewind (warning), a stop (failed), a watching
    guard's would-be rescue (warning). Nothing when the guard never acted (or was not on)."""
    found = []
    qk = no_qk_advice(h.model)
    for r in h.with_key("rescue"):
        rescue = r["rescue"]
        if not isinstance(rescue, dict):
            continue
        action, step = str(rescue.get("action", "")), r["step"]
        fix = structural_fix(rescue.get("lr_cap") or last_cap(h, step), h.trainer, qk, stopped=action == "stop")
        evidence = {k: rescue[k] for k in ("trigger", "trouble_began", "restored_step", "skipped", "lr_cap",
                                           "factor", "number") if rescue.get(k) is not None}
        restored = rescue.get("restored_step")
        if action == "rewind":
            title = (f"{rescue.get('trigger')}; restored step {restored}, learning rate capped at "
                     f"{_g(rescue.get('lr_cap'))}")  # said as "rescued at step N: ..." (the code, the step)
            found.append(Finding("rescued", "warning", title, step=step, warning_step=rescue.get("trouble_began"),
                                 where=("the run",), evidence=evidence, cause=CAUSE, fix=fix,
                                 reference=f"{PALM}; {WORTSMAN}", page="overview"))
        elif action == "stop":
            held = f"; the model holds step {restored}'s weights" if restored is not None else ""
            again = " again" if rescue.get("number", 1) > 1 else ""
            title = f"the guard stopped the run at step {step}: {rescue.get('trigger')}{again}{held}"
            found.append(Finding("guard_stopped", "failed", title, step=step, where=("the run",), evidence=evidence,
                                 cause=CAUSE + "; rescued with lower rates it still relapsed", fix=fix,
                                 reference=f"{PALM}; {WORTSMAN}", page="overview"))
        elif action.startswith("watch"):
            would = "stopped the run" if action.endswith("stop") else f"rewound it to step {restored}"
            title = f"the guard (watching) would have {would} at step {step}: {rescue.get('trigger')}"
            found.append(Finding("guard_would_rescue", "warning", title, step=step, where=("the run",),
                                 evidence=evidence, cause=CAUSE, fix=fix, reference=f"{PALM}; {WORTSMAN}",
                                 page="overview"))
    return found


CAUSE = ("the loss blew up against its own recent level (or went non-finite): the updates were too large "
         "for the loss surface at that rate")


def last_cap(h: RunHistory, step: int) -> float | None:
    """The cap of the last rewind before `step` (a stop's record carries none of its own)."""
    caps = [r["rescue"].get("lr_cap") for r in h.with_key("rescue") if r["step"] < step and rewound(r)]
    return caps[-1] if caps else None


def _g(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, (int, float)) else "-"
