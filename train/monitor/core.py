"""The Monitor itself (`train.monitor` is where users import it from, with the Trainer callback): its
set-up, the optimizer step hooks, snapshots, the close; its records are `train.monitor.recording`,
its guard a plugin (`train.monitor.plugins`)."""

from __future__ import annotations

import atexit
import logging
import math
import os
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from models.store.live import hooked_twin, model_kind, twin_config, unwrap
from models.store.run import read_metrics, sync_metrics
from train.guard.monitor import guard_plugin  # the guard's one way in: a Plugin (train.monitor.plugins)
from train.monitor.disk import RunFolderWrites
from train.monitor.opening import open_run
from train.monitor.parts import (EvalReadings, autocast_factory, check_eval_tokens, check_model, grad_squares, group_lrs,
                                 monitored_run_json, update_readings)
from train.monitor.plugins import Plugin
from train.monitor.recording import Recording
from train.monitor.wandb_mirror import mirror_for
from train.run_lock import RunLock
from train.values import first_optimizer, number, setting

log = logging.getLogger("train.monitor")

__all__ = ["Monitor"]


class Monitor(Recording):
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
        self.resume, self.report_at_close, self.autocast = resume, report, autocast
        self.plugin: Plugin | None = guard_plugin(guard)  # what the Monitor calls of the guard, if asked for one
        self.guard: Any = None  # the guard at work, left here by its plugin when it hooks (its rescues, ...)
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
            self._handles = [*(self.plugin.hook(self) if self.plugin is not None else []),  # the guard's first
                             self.optimizer.register_step_pre_hook(self._before_step),
                             self.optimizer.register_step_post_hook(self._after_step)]
        except BaseException:
            if self._lock is not None:
                self._lock.release()
            raise

    def _run_json(self) -> dict[str, Any]:
        """What run.json says of a loop the Monitor watches (`train.monitor.parts.monitored_run_json`),
        and its guard's settings."""
        guard = self.plugin.describe() if self.plugin is not None else {}
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

    # ------------------------------------------------------------------ snapshots

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

