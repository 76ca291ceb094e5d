"""The Monitor inside a Hugging Face `Trainer`: `trainer.add_callback(HFCallback("runs/x"))`.

The Trainer's own log lines (loss, eval_loss, grad_norm: its norm before clipping) join the
records the Monitor measures on the optimizer's step (the rate the optimizer applied, g/w/u at log
steps, the model's internals at eval steps with `eval_tokens`), in an ordinary run directory that
the run doctor, every CLI and the app read. With a guard, each step's own loss (the one the model
returned on its training forwards) is judged at that step, not the logging window's mean every
`logging_steps`. Needs `transformers` (`pip install 'scratchscope[hf]'`).
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

from train.monitor.core import Monitor
from train.guard import GuardStop

__all__ = ["HFCallback", "StepLoss", "TRAINER_KEYS"]

# the Trainer's log names -> ours (metrics.jsonl); others are kept under their own names. Its
# learning_rate is the schedule's: the record's lr is the rate the optimizer applied (a guard's cap
# included), which the Monitor reads on the optimizer's step itself.
TRAINER_KEYS = {"loss": "train_loss", "eval_loss": "val_loss", "grad_norm": "grad_norm"}


class StepLoss:
    """The loss of each optimizer step, from the loss the model returned on its training forwards
    (a forward hook; nothing read on the host here). Under gradient accumulation the micro-batches'
    losses add up to the step's mean when the Trainer handed the model `num_items_in_batch` (each is
    its tokens' sum over the step's count), else they are averaged. A model that returned no loss
    (a `compute_loss_func`, label smoothing: the Trainer computes the loss itself) gives none."""

    def __init__(self, model: torch.nn.Module, ranks: int = 1):
        self.parts: list[torch.Tensor] = []  # [] 0-d each, on the model's device
        self.summed = False
        self.ranks = ranks  # the token count was summed over this many ranks: a rank's share times it
        self.seen = False  # a loss came at least once: the guard judges each step's, not the Trainer's mean
        self.handle = model.register_forward_hook(self._hook, with_kwargs=True)

    def _hook(self, module: torch.nn.Module, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        if not module.training or not torch.is_grad_enabled():
            return  # an evaluation's forward
        loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self.parts.append(loss.detach().reshape(()))
            self.summed = kwargs.get("num_items_in_batch") is not None

    def take(self) -> torch.Tensor | None:
        """The step's loss (a 0-d tensor on the device), or None; the parts are cleared."""
        parts, self.parts = self.parts, []
        if not parts:
            return None
        self.seen = True
        total = torch.stack(parts).sum()
        return total * self.ranks if self.summed else total / len(parts)

    def close(self) -> None:
        self.handle.remove()


class HFCallback(TrainerCallback):
    """A `TrainerCallback` that opens a Monitor on the Trainer's model and optimizer when training
    begins and closes it (printing the doctor's diagnosis) when it ends. Keyword arguments are
    the Monitor's (`log_every`, `eval_every`, `eval_tokens`, `diagnose_every`, `save_every`,
    `guard`, ...); the guard judges each step's loss (the model's own, `StepLoss`; the Trainer's
    logged mean where the model returns none) and the gradient norm the Monitor measures, and its
    stop sets `should_training_stop`."""

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
        self.step_loss: StepLoss | None = None
        self.read_each_step = True  # a float per step for the guard (where reading it adds no wait)

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       optimizer: Any = None, **kwargs: Any) -> None:
        if model is None or optimizer is None:
            raise ValueError("HFCallback: the Trainer gave no model or optimizer at on_train_begin")
        # the Trainer numbers a step after taking it: the first one it takes now is global_step + 1
        options = {"steps": state.max_steps or None, "start_step": state.global_step + 1,
                   "resume": state.global_step > 0, "trainer": "hf", **self.options}
        self.monitor = Monitor(model, optimizer, self.out_dir, **options)
        if self.monitor.guard is not None:
            average = getattr(args, "average_tokens_across_devices", False)
            self.step_loss = StepLoss(model, getattr(args, "world_size", 1) if average else 1)
            # the Trainer reads every micro-batch's loss on the host already (its NaN filter, on by
            # default), and a CPU never waits: there a float per step costs nothing more; else the
            # tensor goes to the guard, which reads it at the Monitor's log steps (no sync between)
            self.read_each_step = bool(getattr(args, "logging_nan_inf_filter", True)) or \
                next(model.parameters()).device.type == "cpu"

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.monitor is None:
            return
        loss = self.step_loss.take() if self.step_loss is not None else None
        if loss is not None and self.read_each_step:
            loss = float(loss)
        with self._guarded(control):  # the guard judges the step's loss (and a gradient norm measured here)
            self.monitor.log(state.global_step, train_loss=loss)  # the optimizer's step just taken is this one

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        # only the per-step names: the summary at the end has a run-mean "train_loss" of its own
        values = {TRAINER_KEYS[k]: v for k, v in (logs or {}).items() if k in TRAINER_KEYS
                  and (isinstance(v, (int, float)) and not isinstance(v, bool)
                       or isinstance(v, torch.Tensor) and v.numel() == 1 and v.is_floating_point())}
        if self.monitor is None or not values:
            return
        pending = self.monitor._pending
        if pending is not None and pending["step"] == state.global_step and "rescue" in pending:
            values.pop("train_loss", None)  # a rescued step's record keeps its own loss (the state in trouble)
        with self._guarded(control):  # without a loss from the model, the guard judges the Trainer's mean
            judged = self.monitor.guard is None or self.step_loss is not None and self.step_loss.seen
            if judged or not self.monitor.plugin.at_log(self.monitor, state.global_step, values):
                self.monitor.record(state.global_step, **values)

    @contextmanager
    def _guarded(self, control: Any) -> Iterator[None]:
        """A guard's stop (train.guard: records written, the last good state restored) ends the
        training the Trainer's way, not with an exception through it."""
        try:
            yield
        except GuardStop:
            self.monitor = None  # closed by the stop
            self._unhook()
            control.should_training_stop = True

    def _unhook(self) -> None:
        if self.step_loss is not None:
            self.step_loss.close()
            self.step_loss = None

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._unhook()
        if self.monitor is not None:
            self.monitor.close()
            self.monitor = None
