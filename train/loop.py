"""Train a preset on a text file and write a run directory the probes and the app read.

    python -m train --preset transformer4_rms_small --data data/tinyshakespeare.txt --out runs/x
    torchrun --nproc_per_node=2 -m train --preset tiny_shakespeare_gpt --data data/tinyshakespeare.txt \\
        --out runs/gpt --dtype bf16

RUN_DIR gets run.json (what produced it), metrics.jsonl (one record per logged step: loss,
val ppl, BPC, attention entropy per head, g/w/u per parameter, step time) and snapshots
step_NNNNNN/ (weights, tokenizer, optimizer state) at step 0, every --save-every steps, at the
end and on Ctrl-C. Hyperparameters default to the preset's recorded training recipe
(`PRESETS[name].train`); a flag overrides them; on --resume the run's own saved values do.
Every sampled batch is a function of (seed, rank, step), so a resumed run continues exactly.
"""

from __future__ import annotations

if __name__ == "__main__":  # Ctrl-C/SIGTERM: one line from here on (`python -m train` is the usual way)
    from models.interrupts import quiet_signals
    quiet_signals()

import argparse
import logging
import math
import os
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Iterator

import torch

from models.checkpoint import read_metrics, snapshot_name
from models.cli import run_cli
from models.interrupts import EXIT_INTERRUPTED, deferred_signals, signal_exit
from models.store.run import METRICS_FILE
from train.args import build_parser
from train.config import init_distributed, lr_at
from train.doctor import LiveDoctor
from models.loss import lm_loss_and_z
from train.data import block_len, lm_loss, predictions_per_block, sample_blocks
from train.monitor.save import save_with_view
from train.guard.loop import attach, judge_steps, stop_run
from train.records import (console_line, open_monitor, run_description, to_json_line, trim_metrics,
                           write_record)
from train.start import (lock_run_dir, prepare_run_dir, recipe, restore, setup,  # noqa: F401
                         wrap_model)
from train.state import TrainState

log = logging.getLogger("train")

EXIT_DIVERGED = 3  # the loss or an attention entropy turned NaN/inf (see --keep-going)
RANK_DUMP_ENV = "SCRATCHSCOPE_RANK_STATE_DIR"  # tests: every rank saves its final weights here

# the run records (run.json, metrics.jsonl, log line) live in train.records, re-exported here
__all__ = ["EXIT_INTERRUPTED", "RANK_DUMP_ENV", "TrainState", "backward_micro_batches", "batch_seed",
           "build_parser", "dump_rank_state", "is_due", "main", "prepare_run_dir", "recipe",
           "restore", "run_description", "run_steps", "save", "console_line", "setup",
           "to_json_line", "train", "train_step", "trim_metrics", "wrap_model", "write_record",
           "write_run_json_for"]


# --------------------------------------------------------------------------- one step


def batch_seed(seed: int, rank: int, step: int, micro: int = 0) -> int:
    """A distinct seed per (seed, rank, step, micro-batch): ranks differ, resume is exact."""
    return (((seed * 1_000_003 + step) * 1024 + rank) * 256 + micro) % (2**63 - 1)


def backward_micro_batches(state: TrainState) -> torch.Tensor:
    """--grad-accum micro-batches of --batch-size windows; DDP syncs grads on the last only.
    Returns the mean cross-entropy; with --z-loss COEF, COEF * log²Z is added to what is
    differentiated and summed into `state.z_sum` (logged on its own as z_loss)."""
    tc, accum = state.tc, state.tc["grad_accum"]
    coef = tc.get("z_loss") or 0.0
    total = torch.zeros((), device=state.device)
    for micro in range(accum):
        seed = batch_seed(tc["seed"], state.dist.rank, state.step, micro)
        torch.manual_seed(seed)  # dropout
        block = sample_blocks(state.corpus.train, tc["batch_size"], block_len(state.cfg),
                              torch.Generator().manual_seed(seed))  # [batch block_len]
        sync = micro == accum - 1 or not state.dist.enabled
        with nullcontext() if sync else state.model.no_sync():
            with state.autocast():
                inputs = block.to(state.device, non_blocking=True)
                if coef:
                    ce, log_z_sq = lm_loss_and_z(state.model, inputs)
                    z_term = coef * log_z_sq / accum
                    state.z_sum += z_term.detach().float()
                else:
                    ce, z_term = lm_loss(state.model, inputs), 0.0
            (ce / accum + z_term).backward()
        total += ce.detach().float() / accum
    return total


def train_step(state: TrainState, measure: bool) -> tuple[torch.Tensor, float | None]:
    """One optimizer step: (loss on device, the grad norm before clipping if `measure`). The
    step's g/w/u table is measured by the run's Monitor, hooked on the optimizer."""
    tc, step = state.tc, state.step
    lr = lr_at(step, tc)
    for group in state.optimizer.param_groups:
        group["lr"] = lr
    loss = backward_micro_batches(state)  # [] mean nats over the step's windows
    norm = None
    if tc["grad_clip"] > 0 or measure:
        clip = tc["grad_clip"] if tc["grad_clip"] > 0 else math.inf
        norm = torch.nn.utils.clip_grad_norm_(state.raw_model.parameters(), clip)
    state.optimizer.step()
    state.optimizer.zero_grad(set_to_none=True)
    return loss, float(norm) if measure and norm is not None else None


# --------------------------------------------------------------------------- records



def save(state: TrainState) -> None:
    if state.dist.is_main and state.last_saved != state.step:
        save_with_view(state.args.out / snapshot_name(state.step), state.raw_model, state.corpus.tokenizer,
                       step=state.step, tokens_seen=state.tokens, train_config=state.tc, optimizer=state.optimizer)
        state.last_saved = state.step


def is_due(step: int, every: int, last: int) -> bool:
    return step == last or (every > 0 and step % every == 0)


# --------------------------------------------------------------------------- loop


def run_steps(state: TrainState) -> None:
    """Train to tc["steps"]; a record every --log-every / --eval-every steps, snapshots on time.

    The loss stays on the device between records (no per-step host sync), and so does the
    first step whose loss was non-finite; step_time_ms is the wall time since the previous
    record divided by the steps taken, evals and saves excluded.
    """
    tc, dist = state.tc, state.dist
    per_step = tc["batch_size"] * tc["grad_accum"] * predictions_per_block(state.cfg) * dist.world_size
    loss_sum, n, t0, last = torch.zeros((), device=state.device), 0, time.perf_counter(), tc["steps"]
    first_bad = torch.full((), -1, dtype=torch.long, device=state.device)  # step of the first NaN loss
    state.z_sum = torch.zeros((), device=state.device)  # --z-loss: its term, summed like the loss
    seen: list[torch.Tensor] = []  # --guard: each step's loss since the last record, on the device
    with progress(state) as bar:
        while state.step < last and not state.stop_requested():
            log_now = is_due(state.step + 1, tc["log_every"], last)
            eval_now = is_due(state.step + 1, tc["eval_every"], last)
            loss, grad_norm = train_step(state, measure=(log_now or eval_now) and dist.is_main)
            state.step, state.tokens, n = state.step + 1, state.tokens + per_step, n + 1
            first_bad = torch.where((first_bad < 0) & ~torch.isfinite(loss), state.step, first_bad)
            loss_sum += loss.float()
            seen += [loss.detach()] if state.guard is not None else []
            bar.update(1)
            if log_now or eval_now:
                plan, seen = judge_steps(state, seen), []  # the guard (train.guard.loop): None if calm
                mean_loss = float(loss_sum) / n  # syncs the device
                record = {"step": state.step, "tokens": state.tokens, "lr": lr_at(state.step - 1, tc),
                          "train_loss": dist.mean(mean_loss),
                          "step_time_ms": 1000 * (time.perf_counter() - t0) / n}
                if tc.get("z_loss"):
                    record["z_loss"] = dist.mean(float(state.z_sum) / n)
                    state.z_sum.zero_()
                if dist.is_main:
                    record["grad_norm"] = grad_norm
                    record = write_record(state, record, eval_now, first_bad=int(first_bad),
                                          rescue=plan.record if plan else None)
                    if state.doctor is not None:  # a blow-up said now (a divergence stops the run: on_divergence),
                        # a warning at the eval step that brought its evidence
                        due = state.doctor.due(state.step)
                        alarm = "diverged" not in record and state.doctor.alarm(record) and not due
                        evidence = state.doctor.evidence(record) and not due
                        state.doctor.note(record)
                        if alarm or evidence:
                            state.doctor.check(failing_only=not evidence)
                loss_sum.zero_()
                n = 0
                if plan is not None and state.guard.act(plan)["action"] in ("rewind", "skip"):  # all ranks alike
                    first_bad.fill_(-1)  # the run goes on from a finite state
                    if dist.is_main:
                        state.monitor.first_nonfinite_step = None
                elif plan is not None and plan.record["action"] == "stop":
                    stop_run(state, plan, per_step)
                    break
                if dist.mean(float("diverged" in record)) > 0 and on_divergence(state, record):
                    break
            if state.doctor is not None and state.doctor.due(state.step):
                state.doctor.check()
            if is_due(state.step, tc["save_every"], last):
                save(state)
            if n == 0:
                t0 = time.perf_counter()


@contextmanager
def progress(state: TrainState) -> Iterator[Any]:
    """A tqdm bar over steps on stderr (log lines print above it), or a stand-in that does nothing."""
    show = state.args.progress
    if show is None:
        show = sys.stderr.isatty() and not state.args.quiet
    if not (show and state.dist.is_main):
        yield _NoBar()
        return
    from tqdm.auto import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    with tqdm(total=state.tc["steps"], initial=state.step, unit="step", file=sys.stderr,
              dynamic_ncols=True) as bar, logging_redirect_tqdm():
        yield bar


class _NoBar:
    def update(self, n: int) -> None:
        pass


def on_divergence(state: TrainState, record: dict[str, Any]) -> bool:
    """Save the moment the run diverged and say what went non-finite; True if training stops."""
    first = state.diverged_at is None
    if first:
        state.diverged_at = state.step
        save(state)
    if state.args.keep_going:
        if first:
            log.warning("training diverged at step %d (%s); --keep-going: training on. Saved %s",
                        state.step, describe_divergence(record), snapshot_name(state.step))
            if state.doctor is not None:
                state.doctor.check()
        return False
    return True


def describe_divergence(record: dict[str, Any]) -> str:
    info = record.get("diverged") or {}
    params = info.get("nonfinite_params") or []
    shown = ", ".join(params[:5]) + (f" and {len(params) - 5} more" if len(params) > 5 else "")
    first = info.get("first_nonfinite_loss_step")
    when = f"; the loss was first non-finite at step {first}" if first else ""
    return (f"{info.get('reason', 'non-finite values')}{when}; non-finite parameters: "
            f"{shown or 'none (the activations overflowed)'}")


def train(args: argparse.Namespace) -> int:
    dist = init_distributed(args.device)
    lock = state = None
    try:
        lock = lock_run_dir(args, dist)
        state = setup(args, dist)
        state.bf16 = state.tc["dtype"] == "bf16"
        state.make_val_blocks()
        wrap_model(state)
        state.guard = attach(state)  # --guard: hooked on the optimizer before the Monitor is
        if dist.is_main:
            state.doctor = LiveDoctor(args.out, args.diagnose_every)
        with state.signals():  # a signal from here on only stops the loop: the last step is saved
            open_run(state)
            if state.guard is not None:
                state.guard.keep(state.step)  # the state training starts from: the first to go back to
            run_steps(state)
            save(state)
            dump_rank_state(state)
        if state.doctor is not None and not state.interrupted:  # a signal gets its one line only
            state.doctor.report()  # the diagnosis when training ends or diverges, before its last line
        dist.wait_for_all()  # every rank reaches here: the loop stops on all ranks at one step
        return outcome(state)
    finally:
        with deferred_signals():  # the lock file goes whole, even on a second signal
            if state is not None and state.monitor is not None:
                state.monitor.close(report=False)  # unhooks the optimizer (the doctor reported above)
            if lock is not None:
                lock.release()
            dist.close()


def open_run(state: TrainState) -> None:
    """run.json, and for a fresh run the step-0 record and snapshot (a run directory from the
    first write on: a signal meanwhile stops training at step 0, after them)."""
    args = state.args
    if state.dist.is_main:
        if state.resumed_from is not None:
            trim_metrics(args.out, state.step)
        else:
            (args.out / METRICS_FILE).unlink(missing_ok=True)  # stale, from a run with no snapshot
        open_monitor(state)  # run.json, after every check: a failed --resume appends nothing
        if state.resumed_from is not None:
            state.last_saved = state.step
        else:
            write_record(state, {"step": 0, "tokens": 0, "lr": lr_at(0, state.tc)}, True)
            save(state)
    log.info("training %s on %s for %d steps (%s)", state.tc["preset"], state.device,
             state.tc["steps"], "resumed at step %d" % state.step if state.step else "fresh")


def outcome(state: TrainState) -> int:
    """The exit code of a training that ran its loop, and its last line."""
    if state.guard is not None and state.guard.stopped and state.guard.settings.mode == "act":
        return EXIT_DIVERGED  # the guard said why and what to change (train.guard.loop.stop_run)
    if state.diverged_at is not None and not state.args.keep_going:
        record = next((r for r in reversed(read_metrics(state.args.out)) if r.get("diverged")), {})
        log.error("training diverged at step %d: %s. Saved %s; lower --lr, add a norm "
                  "(--set norm=rms) or pass --keep-going", state.diverged_at,
                  describe_divergence(record), snapshot_name(state.diverged_at))
        return EXIT_DIVERGED
    if state.interrupted:
        line, code = signal_exit(state.stop_signal)
        log.warning("%s at step %d: saved %s", line, state.step, snapshot_name(state.step))
        return code
    log.info("training finished at step %d", state.step)
    return 0


def dump_rank_state(state: TrainState) -> None:
    """Tests of DDP: with $SCRATCHSCOPE_RANK_STATE_DIR set, every rank saves its final weights."""
    directory = os.environ.get(RANK_DUMP_ENV)
    if directory:
        from safetensors.torch import save_file

        tensors = {k: v.detach().cpu().contiguous() for k, v in state.raw_model.state_dict().items()}
        save_file(tensors, str(Path(directory) / f"rank{state.dist.rank}.safetensors"))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_early(argv)  # one line and exit 2 on a bad command line
    args.argv = argv
    rank = int(os.environ.get("RANK", "0"))
    level = logging.WARNING if args.quiet or rank != 0 else logging.INFO
    logging.basicConfig(level=level, format="%(name)s | %(levelname)s | %(asctime)s | %(message)s",
                        datefmt="%Y-%m-%d %H:%M:%S")
    return run_cli(lambda: train(args))


if __name__ == "__main__":
    from models.cli import exit_entry
    exit_entry(main())
