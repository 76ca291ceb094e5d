"""What the guard (`train.guard`, docs/guard.md) did to a run, as the doctor reports it: each rescue a finding
("rescued at step N: ..."), a stop a failure, a watching guard's "would rescue" a warning, a data
shift it let be an info; and the fix its evidence names. A data spike's fix is the data at the
steps skipped (the rate was not the cause); a rate blow-up's (or a stall's) is the rate the rescue
settled on: the last cap in force after the last rescue.

A record the guard acted on holds the numbers of its step (the state in trouble: they are the truth
of that step) and a `rescue` entry: {kind (data_spike | rate_blowup | stall | data_shift), action
(skip | rewind | stop | none | lift; "watch: would ..." when watching), why, trigger, trouble_began,
number, restored_step, skipped, skipped_steps, lr_cap, factor, rate_from}. Records written before
the guard judged kinds have no `kind` and act by rewind or stop: they read as rate trouble. A
skipped or rewound step is no divergence: the run went on from a finite state (`rewound`).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from probes.doctor import flags
from probes.doctor.finding import WORTSMAN, Finding, rule
from probes.doctor.run_history import RunHistory
from probes.doctor.thresholds import DoctorThresholds

__all__ = ["PALM", "by_attention", "data_fix", "last_weights_reset", "no_qk_advice", "rescues", "rewound", "settled_cap",
           "stable_rate", "stopped", "structural_fix"]

PALM = "Chowdhery et al. 2022, PaLM: restarting about 100 steps before a spike and skipping 200-500 batches"
OLMO = "OLMo-core's SkipStepOptimizer: an update whose loss is far off its recent level is not taken"
UNDONE = ("rewind", "skip")  # actions after which the run went on from a state without the step's update


def _rescue(record: dict[str, Any]) -> dict[str, Any] | None:
    rescue = record.get("rescue")
    return rescue if isinstance(rescue, dict) else None


def kind_of(rescue: dict[str, Any]) -> str:
    """The kind of trouble the guard judged; an old record (no kind) was a rate rescue."""
    kind = rescue.get("kind")
    return kind if isinstance(kind, str) and kind else "rate_blowup"


def rewound(record: dict[str, Any]) -> bool:
    """A record whose step the guard undid, by a rewind or by skipping its update (its non-finite
    values are not where the run ended)."""
    rescue = _rescue(record)
    return rescue is not None and rescue.get("action") in UNDONE


def stopped(record: dict[str, Any]) -> bool:
    """A record at which the guard stopped the run (after its rescues, or with none to go back to)."""
    rescue = _rescue(record)
    return rescue is not None and rescue.get("action") == "stop"


def last_weights_reset(h: RunHistory) -> int | None:
    """The step of the guard's last rewind or stop (the weights went back to an earlier state), or
    None: a val loss measured before it and one after are of different runs."""
    steps = [r["step"] for r in h.with_key("rescue") if (_rescue(r) or {}).get("action") in ("rewind", "stop")]
    return steps[-1] if steps else None


def settled_cap(h: RunHistory) -> tuple[float | None, int | None]:
    """(the rate cap in force after the guard's last rate rescue, the step it was set or lifted to):
    the last `lr_cap` of a rate blow-up's or stall's rescue or of a lift that followed it. (None,
    step) when a lift took the cap away; (None, None) when no rate rescue was made. A data spike's
    records never set it: the rate was not the cause."""
    cap, at, seen = None, None, False
    for r in h.with_key("rescue"):
        rescue = _rescue(r)
        if rescue is None or str(rescue.get("action", "")).startswith("watch"):
            continue
        action, kind = rescue.get("action"), kind_of(rescue)
        if action == "rewind" and kind in ("rate_blowup", "stall") or action == "lift" and seen:
            seen = True
            cap, at = _finite(rescue.get("lr_cap")), r["step"]
    return cap, at


def structural_fix(lr_cap: float | None, trainer: str = flags.OURS, qk_norm: bool = False,
                   stopped: bool = False, evidence: str = "where the guard's rescue settled") -> str:
    """What to change so that the run needs no rescue: the peak rate the guard settled on (below
    it, when the run relapsed there and was `stopped`), QK-norm (unless `qk_norm`: the model has it,
    or has no attention), the sweep that finds the rate."""
    known = lr_cap is not None and math.isfinite(lr_cap)
    rate = ("lower the peak learning rate" if not known else
            f"lower the peak learning rate below {lr_cap:.3g} (it relapsed even capped there)" if stopped else
            f"lower the peak learning rate to about {lr_cap:.3g} ({evidence})")
    norm = "" if qk_norm else f", normalise queries and keys ({flags.flag('--set qk_norm=rms', trainer)})"
    sweep = "python -m train.sweep --lr ..." if trainer == flags.OURS else "a learning-rate sweep"
    return f"{rate}{norm}; {sweep} finds the highest rate that trains without rescue"


def data_fix(steps: list[int]) -> str:
    """A data spike's fix: the batches skipped, to look at; the rate is not the cause."""
    where = f"steps {_steps(steps)}" if steps else "the steps skipped"
    return (f"check the data at {where} (the batches the guard skipped: corrupt, shuffled or foreign "
            "text, a tokenizer or loader bug); the learning rate was not the cause, keep it")


def no_qk_advice(model: dict[str, Any]) -> bool:
    """A model (as run.json says it) that has QK-norm already, or no attention heads we know of."""
    return model.get("qk_norm") not in (None, "none") or not model.get("n_heads")


@rule("rescued", "guard_stopped", "guard_would_rescue", "data_shift")
def rescues(h: RunHistory, t: DoctorThresholds) -> list[Finding]:
    """One finding per record the guard acted on: a skip or rewind (warning), a stop (failed), a
    watching guard's would-be rescue (warning), a data shift let be (info; not where a rewind of the
    same episode followed: said in the rewind's). Nothing when the guard never acted (or was not
    on). A lift of the cap is no finding: it is part of the rate rescue's."""
    found = []
    qk = no_qk_advice(h.model)
    cap, cap_step = settled_cap(h)
    undone = shifts_undone(h)
    for r in h.with_key("rescue"):
        rescue = _rescue(r)
        if rescue is None or rescue.get("action") == "lift" or r["step"] in undone:
            continue
        finding = one_rescue(h, r["step"], rescue, fix_for(h, rescue, cap, cap_step, qk))
        shift = next((s for s, by in undone.items() if by == r["step"]), None)
        if finding is not None and shift is not None:
            finding = replace(finding, title=f"{finding.title} (noted as a data shift at step {shift} first)")
        if finding is not None:
            found.append(finding)
    return found


def shifts_undone(h: RunHistory) -> dict[int, int]:
    """{the step of a data shift noted: the step of the rewind or stop after it that went back to a
    state before the shift began}: the same episode, judged rate trouble in the end."""
    out = {}
    marks = [(r["step"], _rescue(r)) for r in h.with_key("rescue") if _rescue(r) is not None]
    for step, rescue in marks:
        began = rescue.get("trouble_began")
        if kind_of(rescue) != "data_shift" or not isinstance(began, int):
            continue
        later = next((s for s, x in marks if s > step and x.get("action") in ("rewind", "stop")
                      and isinstance(x.get("restored_step"), int) and x["restored_step"] < began), None)
        if later is not None:
            out[step] = later
    return out


def stable_rate(h: RunHistory) -> tuple[float, float, int] | None:
    """(the highest rate logged after the guard's last rate rescue below every rate the run was
    rescued from, the lowest of those, that rescue's step): the rate the run's own evidence says
    trains calmly. None without logged rates after it."""
    lrs, marks = h.logged_lr(), []
    for r in h.with_key("rescue"):
        rescue = _rescue(r)
        if rescue and rescue.get("action") in ("rewind", "stop") and kind_of(rescue) in ("rate_blowup", "stall"):
            began = rescue.get("trouble_began")
            marks.append((r["step"], began if isinstance(began, int) else r["step"]))
    if not marks or not lrs:
        return None
    at_trouble = [next((v for s, v in lrs if began <= s <= step), None) for step, began in marks]
    rescued_from = min((v for v in at_trouble if v is not None), default=math.inf)
    last = marks[-1][0]
    calm = [v for s, v in lrs if s > last and v < rescued_from]
    return (max(calm), rescued_from, last) if calm else None


def fix_for(h: RunHistory, rescue: dict[str, Any], cap: float | None, cap_step: int | None, qk: bool) -> str:
    """The fix a rescue's evidence names: the data for a data spike; otherwise the highest rate the
    run trained at calmly after its last rate rescue, below every rate it was rescued from (never a
    cap lifted late that never limited the rate), else the settled cap."""
    action, kind = str(rescue.get("action", "")), kind_of(rescue)
    if kind == "data_spike":
        return data_fix(skipped_steps(rescue))
    if kind == "data_shift":
        return "none needed: the run learns the new data (check that the change of data was meant)"
    if action.startswith("watch"):
        return structural_fix(_finite(rescue.get("lr_cap")), h.trainer, qk)
    if action.endswith("stop"):
        return structural_fix(_finite(rescue.get("lr_cap")) if cap is None else cap, h.trainer, qk, stopped=True)
    stable = stable_rate(h)
    after = [v for s, v in h.logged_lr() if stable is not None and s > stable[2]]
    if cap is None and cap_step is not None and (stable is None or max(after) >= stable[1]):
        norm = "" if qk else (f"; normalising queries and keys ({flags.flag('--set qk_norm=rms', h.trainer)}) "
                              "makes it rarer")
        return (f"none for the rate: the guard lifted its cap by step {cap_step} and the run trained calmly at "
                f"your schedule's rate; a longer warmup avoids the blow-up{norm}")
    if stable is not None:
        rate, rescued_from, step = stable
        return structural_fix(rate, h.trainer, qk, evidence=f"the highest it trained at calmly after the guard's "
                              f"rescue at step {step}, below the {rescued_from:.3g} it was rescued from")
    return structural_fix(cap, h.trainer, qk)


def one_rescue(h: RunHistory, step: int, rescue: dict[str, Any], fix: str) -> Finding | None:
    action, kind = str(rescue.get("action", "")), kind_of(rescue)
    why = rescue.get("why") or rescue.get("trigger")
    evidence = {k: rescue[k] for k in ("kind", "why", "trigger", "trouble_began", "restored_step", "skipped",
                                       "skipped_steps", "lr_cap", "factor", "rate_from", "number")
                if rescue.get(k) is not None}
    common = dict(step=step, where=("the run",), evidence=evidence, fix=fix, page="overview")
    if kind == "data_shift":
        return Finding("data_shift", "info", f"the loss moved to a new level at step {rescue.get('trouble_began', step)} "
                       f"and the run learns from it: a change of data, not trouble ({why})",
                       cause="the data changed and the model is learning it", reference=PALM, **common)
    cause, reference = CAUSES.get("attention" if by_attention(rescue) else kind, CAUSES["rate_blowup"])
    if action in ("skip", "refuse"):
        steps = skipped_steps(rescue)
        done = "refused the update(s) of" if action == "refuse" else "skipped"
        title = f"{why}; {done} {len(steps) or rescue.get('skipped', '?')} batch(es) ({_steps(steps)}), rate kept"
        return Finding("rescued", "warning", title, warning_step=rescue.get("trouble_began"), cause=cause,
                       reference=reference, **common)
    if action == "rewind":
        title = (f"{why}; restored step {rescue.get('restored_step')}, learning rate capped at "
                 f"{_g(rescue.get('lr_cap'))}")  # said as "rescued at step N: ..." (the code, the step)
        return Finding("rescued", "warning", title, warning_step=rescue.get("trouble_began"), cause=cause,
                       reference=reference, **common)
    if action == "stop":
        restored = rescue.get("restored_step")
        held = f"; the model holds step {restored}'s weights" if restored is not None else ""
        again = " again" if (rescue.get("number") or 1) > 1 else ""
        return Finding("guard_stopped", "failed", f"the guard stopped the run at step {step}: {why}{again}{held}",
                       cause=cause + "; rescued, it still relapsed", reference=reference, **common)
    if action.startswith("watch"):
        would = action.removeprefix("watch:").strip().removeprefix("would").strip() or "act"
        what = {"stop": "stopped the run", "rewind": f"rewound it to step {rescue.get('restored_step')}",
                "skip": "skipped the batch(es)"}.get(would, would)
        return Finding("guard_would_rescue", "warning", f"the guard (watching) would have {what} at step {step}: {why}",
                       cause=cause, reference=reference, **common)
    return None


CAUSES = {  # kind -> (cause, reference)
    "rate_blowup": ("the loss blew up against its own recent level (or went non-finite): the updates were too "
                    "large for the loss surface at that rate", f"{PALM}; {WORTSMAN}"),
    "attention": ("a head's attention collapsed fast (near one-hot within a few dozen updates) while the loss did "
                  "not fall: the updates were too large at that rate (the series' first failure)", WORTSMAN),
    "stall": ("after a rescue the loss stopped coming back toward where it was before the trouble: the rate "
              "(or the state restored) still did not train", f"{PALM}; {WORTSMAN}"),
    "data_spike": ("a few batches had a loss far above the model's on other data: bad batches, not a rate too "
                   "high (their updates were not taken)", f"{OLMO}; {PALM}"),
}


def by_attention(rescue: dict[str, Any]) -> bool:
    """A rate rescue set off by a head's attention collapsing (`train.guard.attention`), not the loss."""
    return kind_of(rescue) == "rate_blowup" and "attention entropy fell" in str(rescue.get("why") or "")


def skipped_steps(rescue: dict[str, Any]) -> list[int]:
    steps = rescue.get("skipped_steps")
    return [s for s in steps if isinstance(s, int) and not isinstance(s, bool)] if isinstance(steps, list) else []


def _steps(steps: list[int]) -> str:
    """Steps as ranges: 150-154, 160."""
    if not steps:
        return "-"
    steps, runs = sorted(set(steps)), []
    start = prev = steps[0]
    for s in steps[1:] + [None]:
        if s is not None and s == prev + 1:
            prev = s
            continue
        runs.append(f"{start}-{prev}" if prev > start else f"{start}")
        if s is not None:
            start = prev = s
    return ", ".join(runs)


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        else None


def _g(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, (int, float)) else "-"
