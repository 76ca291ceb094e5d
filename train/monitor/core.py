"""The Monitor itself (`train.monitor` is where users import it from, with the Trainer callback):
optimizer step hooks, records, eval internals, snapshots, the live doctor."""

from __future__ import annotations

import atexit
import logging
import math
import os
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from models.cli import to_jsonable
from models.store.live import hooked_twin, model_kind, twin_config, unwrap
from models.store.result import nonfinite_tensors
from models.store.run import append_metrics, read_metrics, sync_metrics, trim_metrics
from train.run_lock import RunLock
from train.monitor.disk import RunFolderWrites
from train.monitor.opening import open_run
from train.monitor.wandb_mirror import mirror_for
from train.guard.monitor import guard_settings, hook_guard, monitor_log
from train.monitor.parts import (EvalReadings, autocast_factory, check_eval_tokens, check_model, divergence_reason,
                                 first_optimizer, grad_squares, group_lrs, monitored_run_json, number, placed_internals,
                                 refuse_owned, setting, step_number, update_readings)

log = logging.getLogger("train.monitor")
SYNC_EVERY_S = 10.0  # the longest a written record waits for its fsync

__all__ = ["Monitor"]


class Monitor:
    """Hooks `optimizer` (any torch optimizer, or a wrapper holding one as `.optimizer`) and
    writes `out_dir` as a run directory. Use it as a context manager, or call `close()`. Its
    readings also go into the user's active W&B run and a TensorBoard `writer=` (train.monitor.wandb_mirror)."""

    def __init__(self, model: torch.nn.Module, optimizer: Any, out_dir: str | Path, *,
                 log_every: int = 10, eval_every: int = 100, eval_tokens: torch.Tensor | None = None,
                 save_every: int = 0, tokenizer: Any = None, diagnose_every: int = 0,
                 steps: int | None = None, start_step: int = 0, tokens_per_step: int | None = None,
                 resume: bool = False, run_info: dict[str, Any] | None = None, report: bool = True,
                 autocast: Any = nullcontext, lock: bool = True, trainer: str | None = None,
                 model_args: dict[str, Any] | None = None, guard: Any = False, writer: Any = None):
        log_every, eval_every, save_every, diagnose_every, start_step = (
            setting(name, value, low=1 if name == "log_every" else 0) for name, value in
            (("log_every", log_every), ("eval_every", eval_every), ("save_every", save_every),
             ("diagnose_every", diagnose_every), ("start_step", start_step)))
        steps, tokens_per_step = setting("steps", steps, none=True), setting("tokens_per_step", tokens_per_step, none=True)
        if not isinstance(out_dir, (str, os.PathLike)) or not str(out_dir).strip():
            raise ValueError(f"Monitor: out_dir must name a run directory, got {out_dir!r}"
                             " (an empty path would write into the working directory)")
        self.model, self.optimizer = unwrap(model), first_optimizer(optimizer)
        check_model(self.model, self.optimizer)
        autocast = autocast_factory(autocast)
        self.out_dir = Path(out_dir)
        self.log_every, self.eval_every, self.save_every = log_every, eval_every, save_every
        self.steps, self.tokens_per_step = steps, tokens_per_step
        self.kind = model_kind(self.model)
        # whose settings the doctor's fixes name (probes.doctor.flags): nanoGPT's GPT is trained by
        # its train.py; HFCallback says "hf"; any other loop gets plain words
        self.trainer = trainer or ("nanogpt" if self.kind == "nanogpt" else "unknown")
        self.config = twin_config(self.model)
        self.eval_tokens = check_eval_tokens(eval_tokens, self.config)
        self.plan, self.tapped_model = None, None  # a model the store cannot rebuild: read by the tap
        if self.config is None and self.eval_tokens is not None:
            from train.monitor.tap import read_model
            self.plan, self.tapped_model = read_model(self.model, self.eval_tokens, autocast)
        from train.monitor.tokenizer import saveable_tokenizer  # models.tokenizers only when one is given
        self.tokenizer = None if tokenizer is None else saveable_tokenizer(
            tokenizer, getattr(self.config, "d_vocab", None) or (self.tapped_model or {}).get("d_vocab"), save_every)
        self._eval = (None if self.eval_tokens is None else
                      EvalReadings(self.model, self.config, self.eval_tokens, self.plan, autocast))
        self.any_saver = None  # its snapshots: the weights, its layout and what the probes read of it
        if save_every and self.config is None:
            from train.monitor.save import AnySaver
            self.any_saver = AnySaver(self.model, self.eval_tokens, self.tokenizer, model_args, self.tapped_model)
        self.resume, self.report_at_close, self.autocast, self.guard = resume, report, autocast, guard_settings(guard)
        self.doctor = None
        if diagnose_every or report:
            from train.doctor import LiveDoctor, show_doctor_lines
            self.doctor = LiveDoctor(self.out_dir, diagnose_every)
            show_doctor_lines()
        self.mirror = mirror_for(writer, self.out_dir)  # the user's W&B run / SummaryWriter (train.monitor.wandb_mirror)
        self._next_step = start_step  # the step number the next optimizer step will be logged under
        self._steps_since_log = 0  # optimizer steps taken since the last log call
        self._captures: dict[int, dict[str, Any]] = {}  # step -> what measuring its update left
        self._said_off_by = False
        self._step_lr: float | None = None
        self._pending: dict[str, Any] | None = None
        self._last_written: tuple[int, float] | None = None  # (step, when its record began) for step_time_ms
        self._pending_began = 0.0  # perf_counter() when the pending record's step was first logged
        self._unrecorded: tuple[int, float, dict] | None = None  # the last step logged off the log steps
        self._synced = -math.inf  # perf_counter() of the last fsync of metrics.jsonl
        self._optimizer_steps = 0  # updates taken: a record started after none is no step (a val_loss call)
        self._pending_steps = self._written_steps = 0  # the count when the pending / last written record began
        self._last_logged: int | None = None  # the step of the last log call: its snapshot is saved at close
        self._last_saved: int | None = None
        self._closing_on_error = self._judged = False  # _judged: inside the guard's look at a step
        self._said_no_internals = False
        self._pending_internals: Any = None  # the pending record's internals, coming from the device
        self._measured: tuple[int, Any] | None = None  # (eval step, its internals) measured for the guard first
        self.first_nonfinite_step: int | None = None  # the first step whose train_loss was NaN/inf
        self._handles: list[Any] = []
        self._lock: RunLock | None = None
        self.closed = False  # log and record refuse to write once closed (its lock is let go)
        self.disk = RunFolderWrites(self.out_dir)  # a read-only or full folder stops our writes, not the training
        self._open(run_info, lock)
        atexit.register(self._close_at_exit)  # a script that never closes it still gets its records

    # ------------------------------------------------------------------ set-up and close

    def _open(self, run_info: dict[str, Any] | None, lock: bool) -> None:
        """Open the run directory (`train.monitor.opening.open_run`), then hook the optimizer."""
        self._lock = open_run(self.out_dir, resume=self.resume, lock=lock, run_info=run_info, describe=self._run_json)
        try:
            self._handles = [*hook_guard(self), self.optimizer.register_step_pre_hook(self._before_step),  # guard first
                             self.optimizer.register_step_post_hook(self._after_step)]
        except BaseException:
            if self._lock is not None:
                self._lock.release()
            raise

    def _run_json(self) -> dict[str, Any]:
        """What run.json says of a loop the Monitor watches (`train.monitor.parts.monitored_run_json`),
        and its guard's settings."""
        guard = {"guard": self.guard.to_json()} if self.guard is not None else {}
        return monitored_run_json(
            self.model, self.optimizer, kind=self.kind, trainer=self.trainer,
            model_json=self.tapped_model if self.config is None else self.config.to_dict(),
            schedule={"steps": self.steps, "log_every": self.log_every, "eval_every": self.eval_every},
            eval_tokens=self.eval_tokens) | guard

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: Any) -> None:
        interrupted = exc[0] is not None and issubclass(exc[0], (KeyboardInterrupt, SystemExit))
        self._closing_on_error = exc[0] is not None  # a failed last save is then logged, not raised over it
        if exc[0] is None:
            self.close()  # as report= at construction said
            return
        try:  # the loop's own error (a failed save) is the one the user sees, never masked by the close's
            self.close(report=False if interrupted else None)
        except Exception as err:  # noqa: BLE001
            log.warning("monitor: closing %s after %s also failed: %s: %s", self.out_dir, exc[0].__name__,
                        type(err).__name__, err)

    def _close_at_exit(self) -> None:
        if self._handles:
            self.close()

    def close(self, report: bool | None = None) -> Any:
        """Write what is pending, save the last logged step's snapshot (with save_every, where that
        step's is not saved yet), unhook, unlock; print the diagnosis (unless `report` is False).
        Returns the Diagnosis printed, or None. Also done at interpreter exit if not before; a
        second close does nothing."""
        atexit.unregister(self._close_at_exit)
        if self.closed:
            return None
        self.closed = True
        result = None
        try:
            if self.mirror is not None:
                self.mirror.closing = True
            self._record_last_seen()
            self.flush()
            self._save_last()
            self.disk.write("metrics.jsonl's sync", None, lambda: sync_metrics(self.out_dir))
            if self.doctor is not None and (self.report_at_close if report is None else report):
                result = self.doctor.report()
            if self.mirror is not None:
                self.mirror.close(result)
        finally:
            for handle in self._handles:
                handle.remove()
            self._handles = []
            if self._lock is not None:
                self._lock.release()
                self._lock = None
            self.disk.say_again()
        return result

    def _record_last_seen(self) -> None:
        """The last step the loop logged, when it fell between log steps (steps=500 ends at 499, records
        every 10): recorded, so the run's records end where the run did."""
        last = self._pending["step"] if self._pending else self._last_written[0] if self._last_written else None
        if self._unrecorded is None or (last is not None and self._unrecorded[0] <= last):
            return
        step, began, scalars = self._unrecorded
        self.flush()
        self._start_record(step)
        self._pending.update({n: v for n, v in ((n, number(n, v)) for n, v in scalars.items()) if v is not None})
        self._pending_began = began  # its step time runs to when the loop logged it, not to the close

    def _save_last(self) -> None:
        """The snapshot of the last logged step, the run's final weights: save_every=100 over steps
        0-299 saves 0, 100 and 200 on the way, and 299 here."""
        step = self._last_logged
        if not self.save_every or step is None or step == self._last_saved:
            return
        try:
            self.save(step)
        except Exception as err:  # noqa: BLE001 - the loop's own error is the one to see
            if not self._closing_on_error:
                raise
            log.error("monitor: the last step's snapshot (step %d) was not saved: %s", step,
                      (str(err).strip().splitlines() or [type(err).__name__])[0])

    def _save_due(self, step: int) -> bool:
        return bool(self.save_every) and step % self.save_every == 0 and step != self._last_saved

    # ------------------------------------------------------------------ optimizer hooks

    def due(self, step: int) -> bool:
        """A step whose update is measured (a log, eval or last step)."""
        return (step % self.log_every == 0 or (self.eval_every > 0 and step % self.eval_every == 0)
                or step == self.steps)

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._step_lr = optimizer.param_groups[0].get("lr")
        if self.due(self._next_step):
            from probes.updates import lr_by_name, snapshot_params
            for old in sorted(self._captures)[:-2]:  # never logged: keep memory bounded
                del self._captures[old]
            self._captures[self._next_step] = {"before": snapshot_params(self.model),
                                               "grad_squares": grad_squares(self.model), "lr": self._step_lr,
                                               "lr_groups": group_lrs(optimizer),
                                               "lrs": lr_by_name(self.model, optimizer)}

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        capture = self._captures.get(self._next_step)
        if capture is not None and "before" in capture:
            # measured on the device; read on the host when the record is written
            capture["update"] = update_readings(self.model, capture.pop("before"), capture.pop("grad_squares"),
                                                capture.pop("lrs"))
        self._next_step += 1
        self._steps_since_log += 1
        self._optimizer_steps += 1

    def _follow(self, step: int) -> None:
        """Keep the optimizer's step count in line with the step numbers logged. A log call
        comes right after the update of its step (`optimizer.step(); monitor.log(step)`), or
        just before it (nanoGPT evaluates step N before taking step N); anything else is a
        numbering the Monitor was not told of (start_step): it follows the log from here on."""
        stepped, self._steps_since_log = self._steps_since_log, 0
        if step in (self._next_step - 1, self._next_step) or (not stepped and step < self._next_step):
            return
        if stepped:  # the update just made is this step's
            latest = self._captures.pop(self._next_step - 1, None)
            if latest is not None:
                self._captures[step] = latest
            if not self._said_off_by:
                self._said_off_by = True
                log.info("monitor: step %d logged after the optimizer's step %d: numbering steps as "
                         "logged from here on (give start_step= to measure the first ones)",
                         step, self._next_step - 1)
            self._next_step = step + 1
        else:
            self._next_step = step

    # ------------------------------------------------------------------ records

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
        if self.guard is not None:
            self._last_logged, self._judged = None, True  # its stop saves the state it restored, not this step
            try:
                if monitor_log(self, step, scalars):
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
        from train.guard.monitor import check_update
        return check_update(self, self._next_step if step is None else step, loss)

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

    def save(self, step: int) -> Path | None:
        """A snapshot at `step` in the run directory: ours, else of any model (`train.monitor.save`);
        None where the run folder cannot be written (said once: `train.monitor.disk`)."""
        if self.config is None and self.any_saver is None:  # made with save_every and eval_tokens
            raise ValueError(f"Monitor: give save_every=N and eval_tokens= to save a {type(self.model).__name__}")
        return self.disk.write("the snapshot", step, lambda: self._save_now(step), snapshot=True)

    def _save_now(self, step: int) -> Path:
        from models.store.run import snapshot_name
        tokens = step * self.tokens_per_step if self.tokens_per_step else 0
        if self.config is None:
            saved = self.any_saver.save(self.out_dir / snapshot_name(step), step, tokens)
        else:
            from train.monitor.save import save_with_view
            twin = hooked_twin(self.model, self.config, cached=self._eval._twin if self._eval else None)  # the eval steps'
            saved = save_with_view(self.out_dir / snapshot_name(step), twin,
                                   self.tokenizer, step=step, tokens_seen=tokens)
        self._last_saved = step
        return saved

    @property
    def records(self) -> list[dict[str, Any]]:
        """What metrics.jsonl holds now (the pending record not yet included)."""
        return read_metrics(self.out_dir)

