"""The guard inside the Monitor (`Monitor(..., guard=True)`), plugged in as a
`train.monitor.plugins.Plugin` (`GuardPlugin`, made by `guard_plugin`): `Monitor.log` hands each step to
`monitor_log`, which judges it and, on trouble, writes the step's record with a `rescue` entry and
acts; a stop writes the records, saves the last good state where the store can, prints the
diagnosis and ends the script (`GuardStop`, exit code 3). The Hugging Face callback judges the
Trainer's logged loss through `monitor_log` too, and turns a stop into should_training_stop.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from probes.doctor import flags
from probes.doctor.rescues import no_qk_advice, structural_fix
from train.guard import Guard
from train.guard.ranks import everyone
from train.guard.run import GuardedRun
from train.guard.settings import MODES
from train.guard.stop import EXIT_STOPPED, GuardStop

if TYPE_CHECKING:
    from train.monitor.plugins import Watched  # the Monitor as a plugin sees it: never its class

log = logging.getLogger("train.guard")

__all__ = ["GuardPlugin", "guard_plugin", "stop_line"]  # the rest are the plugin's parts


class GuardPlugin:
    """The guard as the Monitor's plugin (`train.monitor.plugins.Plugin`): its settings in run.json,
    its hooks on the optimizer, its judgement at each `log` and `check`."""

    def __init__(self, settings: Guard):
        self.settings = settings

    def describe(self) -> dict[str, Any]:
        return {"guard": self.settings.to_json()}

    def hook(self, monitor: Watched) -> list[Any]:
        return hook_guard(monitor, self.settings)

    def at_log(self, monitor: Watched, step: int, scalars: dict[str, Any]) -> bool:
        return monitor_log(monitor, step, scalars)

    def at_check(self, monitor: Watched, step: int, loss: Any) -> bool:
        return check_update(monitor, step, loss)


def guard_plugin(value: Any) -> GuardPlugin | None:
    """The Monitor's `guard=` as its plugin, or None (off); a bad value refused in one line."""
    settings = guard_settings(value)
    return None if settings is None else GuardPlugin(settings)


def guard_settings(value: Any) -> Guard | None:
    """Monitor's `guard=`: True (the defaults), "watch", a Guard, or False / None (off); anything
    else refused in one line (when the Monitor is made, before it writes anything)."""
    if value is None or value is False:
        return None
    if value is True:
        return Guard()
    if isinstance(value, str) and value in MODES:
        return Guard(mode=value)
    if isinstance(value, Guard):
        return value
    raise ValueError(f"Monitor: guard must be True, False, 'watch' or a train.guard.Guard, got {value!r}")


def hook_guard(monitor: Watched, settings: Guard) -> list[Any]:
    """The guard at work on the Monitor's optimizer (left on it as `monitor.guard`), holding the state
    before the first update it numbers; its hook handles, registered before the Monitor's own so that
    the rate the Monitor records is the one the guard let through."""
    monitor.guard = GuardedRun(settings, monitor.model, monitor.optimizer, monitor._next_step)
    return monitor.guard.handles


def monitor_log(monitor: Watched, step: int, scalars: dict[str, Any]) -> bool:
    """Judge `step` (the loss logged; the gradient norm and update ratios the Monitor measured at its
    log steps; every 25 steps, the attention entropy on the eval tokens, where it has some); when
    the guard acts or says something, make the step's record with the `rescue` entry in it and
    act. True when the record is made."""
    run, pending = monitor.guard, monitor._pending
    if run.stopped or pending is not None and pending["step"] == step and "rescue" in pending:
        return False  # judged already (the Trainer's log line after its step): the values join the record
    capture = monitor._captures.get(step) or {}  # the Monitor's measurement of this step's update (log steps)
    update = capture["update"].get() if "update" in capture else {}  # read once, kept for the record
    loss, grad = run.read(step, scalars.get("train_loss"), scalars.get("grad_norm", update.get("grad_norm")),
                          monitor.due(step))
    if loss is not None and "train_loss" in scalars:
        scalars["train_loss"] = loss  # a tensor read once, here
    collapsed = None
    if monitor._eval is not None and run.attention_due(step):  # the series' failure: attention gone one-hot
        collapsed = run.attention.see(step, monitor.attention_at(step), int(monitor.eval_tokens.shape[-1]))
    loss, grad, ratio, collapsed = everyone(run.model, loss, grad, median_ratio(update.get("gwu")), collapsed)
    plan = run.observe(step, loss, grad, ratio, collapsed, warned=lambda began: doctor_warning(monitor, run, began))
    if plan is None:
        run.keep(step)
        return False
    # the record (and an eval step's internals) of the state in trouble, with the rate of its update (the
    # Monitor would take the rate at the next record's flush: a capped one)
    monitor.record(step, **{"lr": monitor._step_lr, **scalars})
    rescue = monitor._pending["rescue"] = run.act(plan)  # a name the Monitor owns: log() may not write it
    if rescue["action"] in ("rewind", "skip"):
        monitor.first_nonfinite_step = None  # the run went on from a finite state
    elif rescue["action"] == "stop":
        stop(monitor, step, rescue)
    return True


def check_update(monitor: Watched, step: int, loss: Any) -> bool:
    """`Monitor.check`: False when the guard refuses `step`'s update (`GuardedRun.refuse`), whose
    number is then used up as if it was taken; True otherwise, and always without a guard."""
    run = monitor.guard
    if not isinstance(run, GuardedRun):
        return True
    from train.values import number  # a bad value refused in the Monitor's words
    value = number("train_loss", loss)
    if not run.refuse(step, None if value is None else float(value)):
        return True
    monitor._next_step, monitor._steps_since_log = step + 1, monitor._steps_since_log + 1
    return False


def median_ratio(table: dict[str, Any] | None) -> float | None:
    """The median update ratio u over the parameters of a g/w/u table (None without one)."""
    values = sorted(row["u"] for row in (table or {}).values() if row.get("u") is not None)
    return values[len(values) // 2] if values else None


def doctor_warning(monitor: Watched, run: GuardedRun, began: int) -> tuple[int, str] | None:
    """The doctor's earliest early warning from the model's internals (`probes.doctor.signals.
    growth_signals`: attention or output logits or the residual grown ten-fold, a head's entropy
    collapsed) within two snapshot spans (2 x `every` steps) before the step the loss's trouble
    began (and after the oldest snapshot held), read from the records written so far; None where
    the internals are not logged (no eval_tokens) or none came in that span. Only a recent one:
    these grow ten-fold from the untrained model in healthy runs too (a residual ten-fold at step
    100 sent the rewind of a 3-step rate bump at step 150 back to step 75)."""
    oldest = run.held_since
    if monitor.eval_tokens is None or oldest is None:
        return None
    from probes.doctor.run_history import RunHistory
    from probes.doctor.signals import growth_signals
    from probes.doctor.thresholds import DoctorThresholds
    try:
        history = RunHistory.read(monitor.out_dir)
    except ValueError:  # nothing written yet
        return None
    found = [(s, what) for s, what, _ in growth_signals(history, DoctorThresholds(), before=began)
             if max(oldest, began - 2 * run.settings.every) < s
             and "loss" not in what and "update ratio" not in what]  # the guard reads these itself
    return found[0] if found else None


def stop(monitor: Watched, step: int, rescue: dict[str, Any]) -> None:
    """Write the records, save the restored state as a snapshot where the Monitor saves snapshots
    (ours, or any model with save_every and eval_tokens; never over one on disk; not the state
    before the first update, step -1, which the model in memory holds), say why and what to
    change, print the diagnosis, end the script with exit code 3, a run folder that cannot be
    written to included (said in one line)."""
    saved, failed = None, None
    try:
        monitor.flush()
        restored = rescue.get("restored_step")
        if restored is not None and restored >= 0 and (monitor.config is not None or monitor.any_saver is not None):
            from models.store.run import snapshot_name
            path = monitor.out_dir / snapshot_name(restored)
            saved = path if path.exists() else monitor.save(restored)
    except (OSError, ValueError) as error:  # a read-only or full run folder: CheckpointError is a ValueError
        failed = error
    qk = no_qk_advice(monitor.config.to_dict() if monitor.config is not None else monitor.tapped_model or {})
    log.error("%s", stop_line(step, rescue, monitor.guard, saved, monitor.trainer, qk))
    try:
        monitor.close()
    except (OSError, ValueError) as error:
        failed = failed or error
    if failed is not None:
        log.error("guard: the run's records or snapshot could not be written to %s: %s", monitor.out_dir,
                  str(failed).splitlines()[0] if str(failed) else type(failed).__name__)
    raise GuardStop(EXIT_STOPPED)


def stop_line(step: int, rescue: dict[str, Any], run: GuardedRun, saved: Path | None, trainer: str = flags.OURS,
              qk_norm: bool = False) -> str:
    """The stop's one line: how often it was rescued, what the model holds now, what to change."""
    cap = next((r["lr_cap"] for r in reversed(run.rescues) if r.get("lr_cap") is not None), None)
    restored = rescue.get("restored_step")
    held = ("the model holds no earlier state" if restored is None else
            "the model holds the state it started from" if restored < 0 else
            f"the model holds step {restored}'s weights" + (f" (saved {saved})" if saved else ""))
    done = sum(1 for r in run.rescues if r["action"] in ("rewind", "skip"))
    again = f"after {done} rescue(s), {rescue['why']}" if done else rescue["why"]
    fix = structural_fix(cap, trainer, qk_norm, stopped=True)
    return f"guard: stopped the run at step {step}: {again}; {held}. Try: {fix}"
