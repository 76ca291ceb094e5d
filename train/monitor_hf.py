"""The Monitor inside a Hugging Face `Trainer`: `trainer.add_callback(HFCallback("runs/x"))`.

The Trainer's own log lines (loss, eval_loss, learning_rate, grad_norm: its norm before clipping)
join the records the Monitor measures on the optimizer's step (g/w/u at log steps, the model's
internals at eval steps with `eval_tokens`), in an ordinary run directory that the run doctor,
every CLI and the app read. Needs `transformers` (`pip install 'scratchscope[hf]'`).
"""

from __future__ import annotations

import inspect
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

try:
    from transformers import TrainerCallback
except ImportError as err:  # pragma: no cover - the extra is installed in dev
    raise ImportError("train.monitor.HFCallback needs transformers: pip install 'scratchscope[hf]'") from err

import torch

from train.monitor_core import Monitor
from train.guard import GuardStop
from train.guard.monitor import monitor_log

__all__ = ["HFCallback", "TRAINER_KEYS"]

# the Trainer's log names -> ours (metrics.jsonl); others are kept under their own names
TRAINER_KEYS = {"loss": "train_loss", "eval_loss": "val_loss", "learning_rate": "lr", "grad_norm": "grad_norm"}


class HFCallback(TrainerCallback):
    """A `TrainerCallback` that opens a Monitor on the Trainer's model and optimizer when training
    begins and closes it (printing the doctor's diagnosis) when it ends. Keyword arguments are
    the Monitor's (`log_every`, `eval_every`, `eval_tokens`, `diagnose_every`, `save_every`,
    `guard`, ...); the guard judges the Trainer's logged loss (every `logging_steps`) and the
    gradient norm, and its stop sets `should_training_stop`."""

    def __init__(self, out_dir: str | Path, **monitor_options: Any):
        # refused here, before the Trainer trains: an empty path (Path('') would be the working
        # directory) and a misspelt option
        if not isinstance(out_dir, (str, os.PathLike)) or not str(out_dir).strip():
            raise ValueError(f"HFCallback: out_dir must name a run directory, got {out_dir!r}")
        known = set(inspect.signature(Monitor).parameters) - {"model", "optimizer", "out_dir"}
        unknown = sorted(set(monitor_options) - known)
        if unknown:
            raise TypeError(f"HFCallback: {', '.join(unknown)} is not a Monitor option (it takes: {', '.join(sorted(known))})")
        self.out_dir = Path(out_dir)
        self.options = monitor_options
        self.monitor: Monitor | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       optimizer: Any = None, **kwargs: Any) -> None:
        if model is None or optimizer is None:
            raise ValueError("HFCallback: the Trainer gave no model or optimizer at on_train_begin")
        # the Trainer numbers a step after taking it: the first one it takes now is global_step + 1
        options = {"steps": state.max_steps or None, "start_step": state.global_step + 1,
                   "resume": state.global_step > 0, "trainer": "hf", **self.options}
        self.monitor = Monitor(model, optimizer, self.out_dir, **options)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.monitor is not None:
            with self._guarded(control):  # guard=True: a non-finite gradient norm at a log step is judged here
                self.monitor.log(state.global_step)  # the optimizer's step just taken is this one

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        # only the per-step names: the summary at the end has a run-mean "train_loss" of its own
        values = {TRAINER_KEYS[k]: v for k, v in (logs or {}).items() if k in TRAINER_KEYS
                  and (isinstance(v, (int, float)) and not isinstance(v, bool)
                       or isinstance(v, torch.Tensor) and v.numel() == 1 and v.is_floating_point())}
        if self.monitor is not None and values:
            with self._guarded(control):  # guard=True: its loss (a mean over logging_steps) is judged
                if self.monitor.guard is None or not monitor_log(self.monitor, state.global_step, values):
                    self.monitor.record(state.global_step, **values)

    @contextmanager
    def _guarded(self, control: Any) -> Iterator[None]:
        """A guard's stop (train.guard: records written, the last good state restored) ends the
        training the Trainer's way, not with an exception through it."""
        try:
            yield
        except GuardStop:
            self.monitor = None  # closed by the stop
            control.should_training_stop = True

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.monitor is not None:
            self.monitor.close()
            self.monitor = None
