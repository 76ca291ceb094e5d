"""Everything one training holds between steps: arguments, recipe, data, model, optimizer, counters."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from train.config import DistInfo
from train.data import Corpus, block_len, sample_blocks

log = logging.getLogger("train")


@dataclass(eq=False)
class TrainState:
    args: argparse.Namespace
    tc: dict[str, Any]  # resolved hyperparameters, saved in every snapshot
    cfg: Any  # model config
    corpus: Corpus
    device: torch.device
    dist: DistInfo
    raw_model: torch.nn.Module  # what we save, measure and evaluate
    model: torch.nn.Module  # what we train: raw_model, compiled and/or DDP-wrapped
    optimizer: torch.optim.Optimizer
    step: int  # optimizer steps done
    tokens: int  # target tokens seen, all ranks
    resumed_from: Path | None
    last_saved: int | None = None
    val_blocks: torch.Tensor | None = None  # [n block_len], fixed for the whole run
    bf16: bool = False
    interrupted: bool = False
    stop_signal: int | None = None  # the first SIGINT / SIGTERM seen by the loop (sets the exit code)
    first_loss: float | None = None  # train loss of the first record, for the flat-loss warning
    flat_checked: bool = False
    diverged_at: int | None = None  # first step whose loss was non-finite (--keep-going: reported once)
    doctor: Any = None  # train.doctor.LiveDoctor on rank 0: --diagnose-every and the final report
    monitor: Any = None  # train.monitor.Monitor on rank 0: writes run.json and every record
    z_sum: Any = None  # --z-loss: the term added since the last record, on the device
    guard: Any = None  # train.guard.run.GuardedRun on every rank with --guard (train.guard.loop)

    def autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16)

    def make_val_blocks(self) -> None:
        if self.corpus.val.numel():
            gen = torch.Generator().manual_seed(self.tc["seed"])
            n = self.tc["eval_batches"] * self.tc["batch_size"]
            self.val_blocks = sample_blocks(self.corpus.val, n, block_len(self.cfg), gen).to(self.device)

    def stop_requested(self) -> bool:
        """Ctrl-C / SIGTERM seen here (or, under DDP, on any rank: all stop at the same step)."""
        if not self.dist.enabled:
            return self.interrupted
        flag = torch.tensor([float(self.interrupted)], device=self.dist.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item())

    @contextmanager
    def signals(self) -> Iterator[None]:
        """SIGINT/SIGTERM finish the current step, then the loop saves and stops (saying so in
        one line at the end: a handler that logs could print mid-line, and twice on two signals)."""
        def handler(signum: int, _frame: Any) -> None:
            self.interrupted = True
            self.stop_signal = self.stop_signal or signum

        if threading.current_thread() is not threading.main_thread():
            yield  # signal handlers can only be installed from the main thread
            return
        old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, previous in old.items():
                signal.signal(sig, previous)
