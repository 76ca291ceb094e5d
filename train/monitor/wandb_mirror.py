"""The Monitor's readings mirrored into the dashboard the user already watches: their active W&B run
(`wandb.run`) and/or a TensorBoard `SummaryWriter` handed to the Monitor (`Monitor(..., writer=w)`),
every key under `scratchscope/`, on the user's own step axis.

    wandb.init(project="gpt")                          # the user's, as always: never called here
    monitor = Monitor(model, optimizer, "runs/x")      # finds wandb.run by itself
    monitor = Monitor(model, optimizer, "runs/x", writer=SummaryWriter("tb"))   # TensorBoard

W&B: every key the mirror writes is its own (`scratchscope/...`), the step too
(`scratchscope/step`, the Monitor's step: the user's own numbers); each is defined once by its exact
name with that step key (`define_metric(key, step_metric="scratchscope/step")`, never a glob: W&B
matches globs in no set order). A user's key (`iter`, `step`, their loss) is never written, and W&B's
row counter `_step` never advanced: the readings are logged with `commit=False`, so they join the row
the user has open or logs next, whichever way they log (`step=`, `commit=False`, a step key, none),
and the user's rows keep their keys, values and boundaries. A row holds one record of ours: where
the Monitor logs more often than the user, a later record replaces the one still waiting.
The doctor's new findings and the guard's rescues are W&B alerts (and a text entry in TensorBoard)
naming their step; the verdict goes in the run's summary at close. When W&B syncs
TensorBoard (`wandb.init(sync_tensorboard=True)`), what goes to the writer reaches W&B already: it is
then written once, to the writer. wandb is never imported here: only found in `sys.modules`, where
the user's own import put it, so a run without it pays one dictionary look-up per record.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from functools import wraps
from pathlib import Path
from typing import Any, Callable

from models.store.run import list_snapshots, read_run_json, snapshot_step

from probes.doctor.read_mirror import MIRROR, RUN_KEY, key_part
from probes.doctor.log_file import is_number
from probes.doctor.read_wandb import MIRROR_STEP
from probes.doctor.update_scale import adjusted_table
from probes.update_parts.report import UpdateReport, layout_groups_of

log = logging.getLogger("train.monitor")

__all__ = ["Mirror", "mirror_for", "readings"]



def finite_or_nan(value: Any) -> float:
    return float(value) if is_number(value) else math.nan


def readings(record: dict[str, Any], info: dict[str, Any] | None = None) -> dict[str, float]:
    """The mirrored numbers of one metrics record: the update ratio per parameter group (median
    log10 u, each parameter on its optimizer's scale and in its group as run.json `info` says: what
    the doctor's update rules judge), attention entropy per layer (mean over heads, nats) and per
    head, the largest attention logit per layer and per head, the largest output logit, residual
    rms per layer, dead and saturated units per activation, our gradient norm. None of the user's
    own numbers (loss, lr: they log those themselves). probes.doctor.read_mirror reads them back."""
    out: dict[str, float] = {}
    if "grad_norm" in record:
        out[MIRROR + "grad_norm"] = finite_or_nan(record["grad_norm"])
    table = record.get("gwu")
    if isinstance(table, dict) and table:
        report = UpdateReport.from_table(adjusted_table(info or {}, table), layout_groups=layout_groups_of(info))
        for group, stats in report.groups.items():
            if stats.get("median_log10_u") is not None:
                out[f"{MIRROR}update_log10_u/{key_part(group)}"] = float(stats["median_log10_u"])
    for name in ("attn_entropy", "attn_logit_max"):
        per_layer = record.get(name)
        if isinstance(per_layer, dict):
            for layer, heads in per_layer.items():
                values = [finite_or_nan(v) for v in (heads if isinstance(heads, list) else [heads])]
                if values:
                    value = sum(values) / len(values) if name == "attn_entropy" else max(values)
                    out[f"{MIRROR}{name}/layer_{key_part(layer)}"] = value
                if len(values) > 1:  # each head too: the doctor judges heads (one head: the layer's is its own)
                    out.update({f"{MIRROR}{name}/layer_{key_part(layer)}/head_{i}": v for i, v in enumerate(values)})
    if "logit_max" in record:
        out[MIRROR + "logit_max"] = finite_or_nan(record["logit_max"])
    if isinstance(record.get("resid_rms"), dict):
        for layer, value in record["resid_rms"].items():
            out[f"{MIRROR}resid_rms/layer_{key_part(layer)}"] = finite_or_nan(value)
    if isinstance(record.get("activations"), dict):
        for hook, health in record["activations"].items():
            if isinstance(health, dict):
                for what in ("dead", "saturated"):
                    if what in health:
                        out[f"{MIRROR}{what}_units/{key_part(hook)}"] = finite_or_nan(health[what])
    return out


def guarded(method: Callable[..., None]) -> Callable[..., None]:
    """A mirror that fails (W&B gone, a writer closed) says so once and stops: never the training."""
    @wraps(method)
    def call(self: Mirror, *args: Any) -> None:
        if self.off:
            return
        try:
            method(self, *args)
        except Exception as err:  # noqa: BLE001 - whatever the user's logger raises, training goes on
            self.off = True
            log.warning("monitor: stopped mirroring to W&B/TensorBoard: %s: %s", type(err).__name__, err)
    return call


def mirror_for(writer: Any, out_dir: Path | None = None) -> Mirror | None:
    """A Mirror when there is somewhere to write: a writer given, or wandb imported by the user
    (whose run may start later); else None, and the Monitor pays nothing."""
    if writer is not None and not callable(getattr(writer, "add_scalar", None)):
        raise ValueError(f"Monitor: writer must be a TensorBoard SummaryWriter (with add_scalar), "
                         f"got {type(writer).__name__}")
    if writer is None and "wandb" not in sys.modules:
        return None
    return Mirror(writer, out_dir)


class Mirror:
    """Writes each record's readings, the doctor's findings and the guard's rescues."""

    def __init__(self, writer: Any, out_dir: Path | None = None):
        self.writer, self.out_dir = writer, out_dir
        self.info: dict[str, Any] | None = None  # run.json, read at the first record: the doctor's facts
        self.defined: set[str] = set()
        self.alerted: set[Any] = set()  # what was alerted: a finding's code, a rescue's (action, step)
        self.best_loss = math.inf  # the early-warning signal: how far the loss is above its best
        self.off = False
        self.closing = False  # the Monitor is closing: the user's loop logs no more rows for ours to join
        self.waiting = False  # a record sent, perhaps still waiting for the user's next row (at close: no more come)

    # ------------------------------------------------------------------ where to write

    def wandb_run(self) -> Any:
        wandb = sys.modules.get("wandb")
        return getattr(wandb, "run", None) if wandb is not None else None

    def tensorboard_synced(self) -> bool:
        """W&B copies what a SummaryWriter writes (sync_tensorboard=True, wandb.tensorboard.patch())."""
        wandb = sys.modules.get("wandb")
        patched = getattr(wandb, "patched", None) if wandb is not None else None
        return bool(isinstance(patched, dict) and patched.get("tensorboard"))

    def to_wandb(self) -> Any:
        """The W&B run to write to directly, or None (none active, or it gets our writer's values)."""
        run = self.wandb_run()
        return None if run is None or (self.writer is not None and self.tensorboard_synced()) else run

    # ------------------------------------------------------------------ what is written

    @guarded
    def record(self, record: dict[str, Any]) -> None:
        """One metrics record just written: its readings at its step; a rescue in it is an alert."""
        step, loss = record["step"], record.get("train_loss")
        number = isinstance(loss, (int, float)) and not isinstance(loss, bool)
        if number and math.isfinite(loss):
            self.best_loss = min(self.best_loss, loss)
        if self.writer is None and self.wandb_run() is None:  # wandb imported, no run (yet): nothing to do
            return
        if self.info is None:
            self.send_facts()
        values = readings(record, self.info)
        if number:
            if math.isfinite(self.best_loss):
                values[MIRROR + "loss_above_best"] = float(loss) - self.best_loss if math.isfinite(loss) else math.inf
        if self.closing:  # the run's last step, recorded at close: the user's loop logged no row of it
            values.update({MIRROR + k: float(record[k]) for k in ("train_loss", "val_loss") if is_number(record.get(k))})
        if "diverged" in record:
            values[MIRROR + "diverged"] = 1.0
        if isinstance(record.get("rescue"), dict):
            values[MIRROR + "rescue"] = 1.0
            action = record["rescue"].get("action", "rescue")
            self.alert(f"guard: {action}", rescue_text(step, record["rescue"]), step,
                       "ERROR" if action == "stop" else "WARN", once=(action, step))
        self.write(step, values)

    def write(self, step: int, values: dict[str, float]) -> None:
        if not values:
            return
        if self.writer is not None:
            for key, value in values.items():
                self.writer.add_scalar(key, value, global_step=step)
        run = self.to_wandb()
        if run is not None:
            self.send(run, step, values)

    def send(self, run: Any, step: int, values: dict[str, float]) -> None:
        """Our keys only, into the user's open (or next) row: never a key of theirs, never a commit."""
        for key in values.keys() - self.defined:
            run.define_metric(key, step_metric=MIRROR_STEP)
            self.defined.add(key)
        if self.closing and self.waiting:  # the loop is over: what waits for a row of the user's gets its own
            run.log({}, commit=True)
        run.log({MIRROR_STEP: step, **values}, commit=False)
        self.waiting = True

    @guarded
    def findings(self, found: list[Any]) -> None:
        """New findings of the doctor (warning and up): an alert each, naming the step."""
        for f in found:
            if f.severity in ("warning", "failed"):
                text = f"[{f.severity}] {f.code} at step {f.step}: {f.title}" + (f"; try: {f.fix}" if f.fix else "")
                level = "ERROR" if f.severity == "failed" else "WARN"
                self.alert(f"doctor: {f.code}", text, f.step, level, once=f.code)  # once a code, as the live doctor

    def alert(self, title: str, text: str, step: int | None, level: str, once: Any) -> None:
        if once in self.alerted:
            return
        self.alerted.add(once)
        if self.writer is not None:
            self.writer.add_text(MIRROR + "alerts", text, global_step=step or 0)
        run = self.to_wandb()
        wandb = sys.modules.get("wandb")
        if run is not None and wandb is not None:
            run.alert(title=f"scratchscope {title}", text=text, level=getattr(wandb.AlertLevel, level), wait_duration=0)

    def send_facts(self) -> None:
        """run.json (and the snapshot steps saved so far) under scratchscope/run: the W&B run's config,
        a TensorBoard text; what the doctor reads of the run besides its records (its model's
        context and vocabulary, its optimizer, whose trainer), so that it judges it as from the folder."""
        if self.out_dir is None:
            self.info = {}
            return
        info = read_run_json(self.out_dir) or {}
        facts = {**info, "snapshot_steps": [s for p in list_snapshots(self.out_dir)
                                            if (s := snapshot_step(p)) is not None]}
        self.info = info
        if self.writer is not None:
            self.writer.add_text(RUN_KEY, json.dumps(facts), global_step=0)
        run = self.to_wandb()
        if run is not None:
            run.config.update({RUN_KEY: facts}, allow_val_change=True)

    @guarded
    def close(self, diagnosis: Any) -> None:
        """The run's end: run.json as it ends, the closing findings alerted, the verdict put in the
        summary (our last readings reach W&B with the user's next row, or when their run finishes)."""
        self.send_facts()  # the snapshots saved since, what the Monitor measured into run.json
        run = self.to_wandb()
        if diagnosis is not None:
            self.findings(diagnosis.above_info())
            if run is not None:
                run.summary[MIRROR + "verdict"] = diagnosis.verdict
        if self.writer is not None:
            self.writer.flush()


def rescue_text(step: int, rescue: dict[str, Any]) -> str:
    parts = [f"the guard's {rescue.get('action', 'rescue')} at step {step}"]
    if rescue.get("trigger"):
        parts.append(f"trigger: {rescue['trigger']}")
    if rescue.get("restored_step") is not None:
        parts.append(f"back to step {rescue['restored_step']}")
    if rescue.get("lr_cap") is not None:
        parts.append(f"learning rate capped at {rescue['lr_cap']:g}")
    return "; ".join(parts)
