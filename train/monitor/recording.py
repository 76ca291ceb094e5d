"""The Monitor's records (its other half, `train.monitor.core`, sets it up, hooks the optimizer,
saves and closes): what a `log` call makes of a step, the guard's say first (its plugin), and the
record written to metrics.jsonl with the update measured, the internals at eval steps, a divergence
named, the live doctor told."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import torch

from models.cli import to_jsonable
from models.store.result import nonfinite_tensors
from models.store.run import append_metrics, trim_metrics
from train.monitor.parts import divergence_reason, group_lrs, placed_internals
from train.values import number, refuse_owned, step_number

log = logging.getLogger("train.monitor")
SYNC_EVERY_S = 10.0  # the longest a written record waits for its fsync

__all__ = ["Recording", "SYNC_EVERY_S"]


class Recording:
    """The records half of `train.monitor.Monitor` (its only subclass), which holds the state read here."""

    def log(self, step: int, **scalars: Any) -> None:
        """Log numbers for `step` (train_loss, val_loss, lr, tokens, ... any name but the Monitor's
        own, `OWNED`; a None is "not measured" and left out, a NaN kept). At a log step
        (every `log_every`, an eval step, the last step) they make the step's record, with the
        update the optimizer just made and, at eval steps, the model's internals; a second call
        for the same step adds to that record. Other steps cost one check: a non-finite
        train_loss is remembered (the record that follows names the step it began). A call with
        a val_loss always makes a record: evaluations are rare, and each one counts."""
        step, scalars = self._checked(step, scalars)
        self._follow(step)
        if self.plugin is not None:
            self._last_logged, self._judged = None, True  # its stop saves the state it restored, not this step
            try:
                if self.plugin.at_log(self, step, scalars):
                    return  # trouble: the step's record holds the guard's rescue (train.guard.monitor)
            finally:
                self._judged = False
        self._last_logged = step
        pending = self._pending
        if not self.due(step) and "val_loss" not in scalars and (pending is None or step != pending["step"]):
            loss = scalars.get("train_loss")
            if not isinstance(loss, torch.Tensor):  # a tensor is read at log steps only: no sync here
                loss = number("train_loss", loss)
            if self.first_nonfinite_step is None and isinstance(loss, float) and not math.isfinite(loss):
                self.first_nonfinite_step = step
                if self.doctor is not None and self.doctor.every:  # a record now: the doctor says it now
                    self.record(step, **scalars)
                    self.flush()
            if self._save_due(step):  # save_every=3 with log_every=10: step 3 is saved, though not logged
                self.save(step)
            self._unrecorded = (step, time.perf_counter(),  # detached: the loop's graph is not kept alive
                                {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in scalars.items()})
            return
        self.record(step, **scalars)
        if self.doctor is not None and "train_loss" in scalars and self.doctor.alarm(self._pending):
            self.flush()  # the step's last call (nanoGPT logs its eval first): diagnosed now, not a record later

    def check(self, loss: Any, step: int | None = None) -> bool:
        """Before `optimizer.step()`: False when the guard refuses this update (a bad batch, its loss far
        above the run's level: not taken, nothing to undo later; docs/guard.md), else True (always
        without a guard). `step`: the update's number (default: the one the Monitor counts next)."""
        return self.plugin is None or self.plugin.at_check(self, self._next_step if step is None else step, loss)

    def record(self, step: int, **scalars: Any) -> None:
        """`log` at any step: the numbers make (or join) a record even between log steps (a
        callback forwarding another trainer's own log lines uses this)."""
        step, scalars = self._checked(step, scalars)
        if self._steps_since_log:  # called directly, not from log()
            self._follow(step)
        if not self._judged:
            self._last_logged = step
        values = {name: value for name, value in ((n, number(n, v)) for n, v in scalars.items()) if value is not None}
        if self._pending is not None and step != self._pending["step"]:
            self.flush()
        if self._pending is None:
            self._start_record(step)
        self._pending.update(values)

    def _checked(self, step: Any, scalars: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """The step as an int and the values given (None: not measured, left out), or a one-line
        refusal: a closed Monitor, a bad or backward step, a name the Monitor writes itself."""
        if self.closed:
            raise ValueError(f"Monitor.log: the Monitor of {self.out_dir} is closed (unhooked, its lock "
                             "released): open a new one with resume=True to log more")
        step = step_number(step)
        refuse_owned(scalars)
        last = self._pending["step"] if self._pending else self._last_written[0] if self._last_written else None
        if last is not None and step < last:
            raise ValueError(f"Monitor.log: step {step} after step {last}: steps must not go back "
                             "(a resumed loop: open a new Monitor with resume=True)")
        return step, {name: value for name, value in scalars.items() if value is not None}

    def _start_record(self, step: int) -> None:
        if self.resume and self._last_written is None:
            self._trim_after(step)
        record: dict[str, Any] = {"step": step}
        self._pending_began = time.perf_counter()
        if self.tokens_per_step:  # past 2**63 as a float: the readers' integer columns are 64-bit
            tokens = step * self.tokens_per_step
            record["tokens"] = tokens if tokens <= 2**63 - 1 else float(tokens)
        if self.eval_step(step):
            # at the step's first call: nanoGPT logs its eval before taking the step; measured now,
            # read when the record is written, after the keys made so far (`placed_internals`)
            measured, self._measured = self._measured, None
            self._pending_internals = (list(record), measured[1] if measured and measured[0] == step
                                       else self._internals())
        self._pending, self._pending_steps = record, self._optimizer_steps
        if self._save_due(step):  # the weights of this step, as its internals
            self.save(step)

    def _trim_after(self, step: int) -> None:
        """resume=True: records at or after the first step logged now are redone: drop them."""
        self.disk.write("metrics.jsonl's records from this step on, redone,", step,
                        lambda: trim_metrics(self.out_dir, step - 1))

    def flush(self) -> dict[str, Any] | None:
        """Write the pending record now, with the g/w/u of its step's update; return it."""
        record, self._pending = self._pending, None
        if record is None:
            return None
        record, self._pending_internals = placed_internals(record, self._pending_internals), None
        step = record["step"]
        capture = self._captures.get(step)
        measured = capture["update"].get() if capture and "update" in capture else {}
        lr = capture["lr"] if measured else self._step_lr if self._step_lr is not None else self.optimizer.param_groups[0].get("lr")
        lrs = capture["lr_groups"] if measured else group_lrs(self.optimizer)
        record = {"step": step, "lr": lr, **({"lr_groups": lrs} if lrs else {}), **measured,
                  **{k: v for k, v in record.items() if k != "step"}}  # given values win
        for done in [s for s in self._captures if s <= step]:
            del self._captures[done]
        now = time.perf_counter()
        stepped = self._pending_steps > self._written_steps  # an update since the last record began
        if "step_time_ms" not in record and self._last_written and step > self._last_written[0] and stepped:
            # between the loop's first calls for the two steps: the last record, written at close, too
            record["step_time_ms"] = 1000 * (self._pending_began - self._last_written[1]) / (step - self._last_written[0])
        reason = divergence_reason(record)
        if reason:
            bad = self.first_nonfinite_step
            if bad is None and not math.isfinite(record.get("train_loss") or 0.0):
                bad = step
            record["diverged"] = {"reason": reason, "first_nonfinite_loss_step": bad,
                                  "nonfinite_params": nonfinite_tensors(self.model)}
        # fsync at most every SYNC_EVERY_S (and at once for a rescue or a divergence): one per record
        # cost ~1% of a CPU run's wall clock; a killed process keeps every line written
        sync = "rescue" in record or "diverged" in record or now - self._synced >= SYNC_EVERY_S
        line = to_jsonable(record)
        self.disk.write("the record", step, lambda: append_metrics(self.out_dir, line, sync=sync))
        self._last_written, self._written_steps = (step, self._pending_began), self._pending_steps
        self._synced = time.perf_counter() if sync else self._synced
        if self.mirror is not None:
            self.mirror.record(record)
        if self.doctor is not None:  # a failing signal is diagnosed at once, warnings with their evidence
            alarm, due = self.doctor.alarm(record), self.doctor.due(step) or self.doctor.evidence(record)
            self.doctor.note(record)
            if due or alarm:
                found = self.doctor.check(failing_only=not due)
                if self.mirror is not None:
                    self.mirror.findings(found)
        return record

    def eval_step(self, step: int) -> bool:
        """A step whose record holds the model's internals on the eval tokens."""
        return bool(self.eval_every) and step % self.eval_every == 0 or step == self.steps

    def attention_at(self, step: int) -> dict[str, list[float]]:
        """Each head's attention entropy on the eval tokens now (the guard's collapse reading): at an
        eval step, the entropy of the internals its record will hold (one forward there, not two)."""
        if self._pending is not None and self._pending["step"] == step:  # its record began: measured, or not due
            measured = self._pending_internals[1] if self._pending_internals else None
        elif self.eval_step(step):
            self._measured = (step, self._internals())
            measured = self._measured[1]
        else:
            measured = None
        return self._eval.attention() if measured is None else measured.get().get("attn_entropy") or {}

    def _internals(self) -> Any:
        """The model's internals on the eval tokens, measured now on the device: a HostCopy (read
        when the record is written), or None without eval tokens."""
        if self.eval_tokens is None:
            if not self._said_no_internals:
                self._said_no_internals = True
                log.info("monitor: no eval_tokens given: attention entropy, attention logits, residual "
                         "rms, |logit| and dead units are not measured")
            return None
        return self._eval.measure()
