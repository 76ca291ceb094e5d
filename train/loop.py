"""Train a preset on a text file and write a run directory the probes and the app read.

    python -m train --preset transformer4_rms_small --data input.txt --out runs/x
    torchrun --nproc_per_node=2 -m train --preset tiny_shakespeare_gpt --data input.txt \\
        --out runs/gpt --dtype bf16

RUN_DIR gets run.json (what produced it), metrics.jsonl (one record per logged step: loss,
val ppl, BPC, attention entropy per head, g/w/u per parameter, step time) and snapshots
step_NNNNNN/ (weights, tokenizer, optimizer state) at step 0, every --save-every steps, at the
end and on Ctrl-C. Hyperparameters default to the preset's recorded training recipe
(`PRESETS[name].train`); a flag overrides them; on --resume the run's own saved values do.
Every sampled batch is a function of (seed, rank, step), so a resumed run continues exactly.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from models import PRESETS, build_model
from models.checkpoint import (latest_snapshot, list_snapshots, load_optimizer_state,
                               load_snapshot, read_metrics, resolve_device, save_snapshot,
                               snapshot_name)
from train.data import (Corpus, block_len, check_length, lm_loss, load_corpus,
                         predictions_per_block, sample_blocks)
from probes.updates import gwu_table, snapshot_params
from models.runs import METRICS_FILE, read_run_json
from train.records import (console_line, run_description, to_json_line, trim_metrics,
                              write_record, write_run_json_for)
from train.guard import RunLock, check_optimizer_state, clean_leftovers
from train.config import (DistInfo, build_optimizer, init_distributed, lr_at,
                                model_config, resolve_train_config, train_config_flags)
from models.cli import run_cli

log = logging.getLogger("train")

EXIT_INTERRUPTED = 130
EXIT_DIVERGED = 3  # the loss or an attention entropy turned NaN/inf (see --keep-going)
RANK_DUMP_ENV = "SCRATCHSCOPE_RANK_STATE_DIR"  # tests: every rank saves its final weights here

# the run records (run.json, metrics.jsonl, log line) live in train.records, re-exported here
__all__ = ["EXIT_INTERRUPTED", "RANK_DUMP_ENV", "TrainState", "backward_micro_batches", "batch_seed",
           "build_parser", "dump_rank_state", "is_due", "main", "prepare_run_dir", "recipe",
           "restore", "run_description", "run_steps", "save", "console_line", "setup",
           "to_json_line", "train", "train_step", "trim_metrics", "wrap_model", "write_record",
           "write_run_json_for"]


# --------------------------------------------------------------------------- state


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
    first_loss: float | None = None  # train loss of the first record, for the flat-loss warning
    flat_checked: bool = False
    diverged_at: int | None = None  # first step whose loss was non-finite (--keep-going: reported once)

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
        """SIGINT/SIGTERM finish the current step, then the loop saves and stops."""
        def handler(signum: int, _frame: Any) -> None:
            log.warning("signal %d: stopping after this step and saving a snapshot", signum)
            self.interrupted = True

        if threading.current_thread() is not threading.main_thread():
            yield  # signal handlers can only be installed from the main thread
            return
        old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, previous in old.items():
                signal.signal(sig, previous)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m train", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", metavar="NAME", help="model preset (required unless --resume)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a model config field, e.g. --set n_layers=2 (repeatable)")
    p.add_argument("--data", type=Path,
                   help="UTF-8 text file to train on (on --resume: default the file the run recorded)")
    p.add_argument("--tokenizer", choices=("char", "bpe"), default=None,
                   help="char (default): one token per character; bpe: SentencePiece BPE trained "
                        "on --data. A resumed run keeps its own")
    p.add_argument("--bpe-vocab", type=int, default=2048, help="BPE vocabulary size (default 2048)")
    p.add_argument("--out", type=Path, required=True, metavar="RUN_DIR",
                   help="run directory to create (an existing run is refused unless --resume)")
    p.add_argument("--resume", action="store_true",
                   help="continue RUN_DIR from its latest snapshot, optimizer state included")
    p.add_argument("--new-schedule", action="store_true",
                   help="on --resume, accept a --steps that changes a cosine schedule's horizon "
                        "(and so the learning rate from the resumed step on)")
    train_config_flags(p)
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu or cuda")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default=None,
                   help="fp32 (default) or bf16 autocast (CUDA; also allowed on CPU)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (off by default)")
    p.add_argument("--gwu-table", action="store_true",
                   help="print the full g/w/u table at every eval (default: a one-line group summary)")
    p.add_argument("--keep-going", action="store_true",
                   help="train on after the loss or an entropy turns NaN/inf (default: save a "
                        "snapshot of that moment and stop with exit code 3)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar over steps (default: on when stderr is a terminal)")
    p.add_argument("-q", "--quiet", action="store_true", help="log warnings only")
    return p


# --------------------------------------------------------------------------- setup


def prepare_run_dir(out: Path, resume: bool) -> Path | None:
    """The snapshot to resume from, or None for a fresh run; refuses to clobber an old run."""
    snapshots = list_snapshots(out) if out.is_dir() else []
    if resume:
        if not snapshots:
            raise ValueError(f"--resume: {out} has no step_NNNNNN snapshots to continue from")
        return latest_snapshot(out)
    if snapshots:
        raise ValueError(f"{out} already holds a run ({len(snapshots)} snapshot(s), latest "
                         f"{snapshots[-1].name}); pass --resume to continue it or choose another --out")
    return None


def data_path(args: argparse.Namespace) -> Path:
    """--data, or on --resume the file the run recorded in run.json."""
    if args.data is not None:
        return args.data
    recorded = (read_run_json(args.out) or {}).get("data", {}).get("path") if args.resume else None
    if not recorded:
        raise ValueError("--data is required" + (f" ({args.out}/run.json records no data file)"
                                                  if args.resume else " for a new run"))
    if not Path(recorded).is_file():
        raise ValueError(f"--resume: the run's data file {recorded} (from run.json) is not there; "
                         "pass --data")
    log.info("resume: training on %s, the data file the run recorded", recorded)
    return Path(recorded)


def recipe(args: argparse.Namespace, snap: Any) -> tuple[str, dict[str, Any]]:
    """The preset name and resolved hyperparameters (a resumed run keeps its own preset)."""
    saved = (snap.meta.get("train_config") or {}) if snap else {}
    if snap is None and not args.preset:
        raise ValueError("--preset is required for a new run (python -m models.info lists them)")
    if snap and args.preset and saved.get("preset") not in (None, args.preset):
        raise ValueError(f"--resume: the run was trained as preset {saved['preset']!r}, not "
                         f"{args.preset!r}; leave --preset out to continue it")
    if snap and args.set:
        log.warning("--resume: ignoring --set %s; the run keeps its saved model config", args.set)
    preset = args.preset or saved.get("preset")
    if snap is None and preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of: {', '.join(PRESETS)}")
    tc = resolve_train_config(args, PRESETS[preset].train if preset in PRESETS else {}, saved)
    if snap and saved.get("steps") not in (None, tc["steps"]) and tc["schedule"] == "cosine":
        check_new_horizon(args, saved, tc, int(snap.step or 0))
    return preset, {**tc, "preset": preset}


def check_new_horizon(args: argparse.Namespace, saved: dict[str, Any], tc: dict[str, Any],
                      step: int) -> None:
    """A cosine schedule decays over --steps: changing it on --resume moves the lr mid-run."""
    before, after = lr_at(step, {**tc, "steps": saved["steps"]}), lr_at(step, tc)
    if not args.new_schedule:
        raise ValueError(f"--resume: the run's cosine schedule decays over {saved['steps']} steps; "
                         f"--steps {tc['steps']} would move the lr at step {step} from {before:.3g} "
                         f"to {after:.3g}. Pass --new-schedule to accept that")
    log.warning("--new-schedule: the cosine now decays over %d steps (lr at step %d: %.3g -> %.3g)",
                tc["steps"], step, before, after)


def restore(snap: Any, resume_from: Path, optimizer: torch.optim.Optimizer, tc: dict[str, Any],
            device: torch.device) -> tuple[int, int]:
    """Load the optimizer state of a resumed run; its (step, tokens_seen)."""
    state = load_optimizer_state(resume_from, device)  # torch.load(weights_only=True)
    if state is None:
        raise ValueError(f"--resume: {resume_from} has no optimizer state to continue from")
    check_optimizer_state(state, optimizer, resume_from / "optimizer.pt")
    optimizer.load_state_dict(state)
    step = int(snap.step or 0)
    if step >= tc["steps"]:
        raise ValueError(f"--resume: {resume_from.name} is already at step {step} >= --steps "
                         f"{tc['steps']}; pass a larger --steps to train further")
    return step, int(snap.tokens_seen or 0)


def setup(args: argparse.Namespace, dist: DistInfo) -> TrainState:
    """Everything a training loop needs: model, optimizer, data, config; resumed if asked."""
    resume_from = prepare_run_dir(args.out, args.resume)
    snap = load_snapshot(resume_from) if resume_from is not None else None
    args.data = data_path(args)
    if snap is not None and args.tokenizer not in (None, getattr(snap.tokenizer, "kind", None)):
        raise ValueError(f"--resume: the run was trained with the {snap.tokenizer.kind} tokenizer; "
                         f"--tokenizer {args.tokenizer} cannot change it (leave it out)")
    args.tokenizer = args.tokenizer or "char"
    preset, tc = recipe(args, snap)
    if tc["warmup"] >= tc["steps"]:
        log.warning("--warmup %d is not shorter than the run (--steps %d): the learning rate never "
                    "reaches %g; lower --warmup (the gpt2_124m recipe warms up for 715 steps)",
                    tc["warmup"], tc["steps"], tc["lr"])
    corpus = load_corpus(args.data, args.tokenizer, tc["val_fraction"], bpe_vocab=args.bpe_vocab,
                         tokenizer=snap.tokenizer if snap else None)
    cfg = snap.config if snap else model_config(preset, args.set, corpus.tokenizer.vocab_size)
    check_length(corpus, cfg)
    log.info("%s", corpus.summary())
    if snap is None and cfg.d_vocab != PRESETS[preset].config.d_vocab and not any(
            item.startswith("d_vocab=") for item in args.set):
        log.info("d_vocab: preset %s has %d, the tokenizer has %d tokens: using d_vocab=%d",
                 preset, PRESETS[preset].config.d_vocab, corpus.tokenizer.vocab_size, cfg.d_vocab)
    device = dist.device if dist.enabled else resolve_device(args.device)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
    torch.manual_seed(tc["seed"])
    model = (snap.model.train() if snap else build_model(cfg)).to(device)
    optimizer = build_optimizer(model, tc, device)
    step, tokens = restore(snap, resume_from, optimizer, tc, device) if snap else (0, 0)
    return TrainState(args=args, tc=tc, cfg=cfg, corpus=corpus, device=device, dist=dist,
                      raw_model=model, model=model, optimizer=optimizer, step=step, tokens=tokens,
                      resumed_from=resume_from)


def wrap_model(state: TrainState) -> None:
    """torch.compile and/or DistributedDataParallel around the raw model (which we save)."""
    model = state.raw_model
    if state.args.compile:
        model = torch.compile(model)
    if state.dist.enabled:
        from torch.nn.parallel import DistributedDataParallel

        ids = [state.device.index] if state.device.type == "cuda" else None
        model = DistributedDataParallel(model, device_ids=ids)
    state.model = model


# --------------------------------------------------------------------------- one step


def batch_seed(seed: int, rank: int, step: int, micro: int = 0) -> int:
    """A distinct seed per (seed, rank, step, micro-batch): ranks differ, resume is exact."""
    return (((seed * 1_000_003 + step) * 1024 + rank) * 256 + micro) % (2**63 - 1)


def backward_micro_batches(state: TrainState) -> torch.Tensor:
    """--grad-accum micro-batches of --batch-size windows; DDP syncs grads on the last only."""
    tc, accum = state.tc, state.tc["grad_accum"]
    total = torch.zeros((), device=state.device)
    for micro in range(accum):
        seed = batch_seed(tc["seed"], state.dist.rank, state.step, micro)
        torch.manual_seed(seed)  # dropout
        block = sample_blocks(state.corpus.train, tc["batch_size"], block_len(state.cfg),
                              torch.Generator().manual_seed(seed))  # [batch block_len]
        sync = micro == accum - 1 or not state.dist.enabled
        with nullcontext() if sync else state.model.no_sync():
            with state.autocast():
                loss = lm_loss(state.model, block.to(state.device, non_blocking=True)) / accum
            loss.backward()
        total += loss.detach().float()
    return total


def train_step(state: TrainState, measure: bool) -> tuple[torch.Tensor, dict | None, float | None]:
    """One optimizer step: (loss on device, g/w/u table and grad norm if `measure`)."""
    tc, step = state.tc, state.step
    lr = lr_at(step, tc)
    for group in state.optimizer.param_groups:
        group["lr"] = lr
    loss = backward_micro_batches(state)  # [] mean nats over the step's windows
    norm = None
    if tc["grad_clip"] > 0 or measure:
        clip = tc["grad_clip"] if tc["grad_clip"] > 0 else math.inf
        norm = torch.nn.utils.clip_grad_norm_(state.raw_model.parameters(), clip)
    before = snapshot_params(state.raw_model) if measure else None
    state.optimizer.step()
    table = gwu_table(state.raw_model, before, lr) if measure else None
    state.optimizer.zero_grad(set_to_none=True)
    return loss, table, float(norm) if measure and norm is not None else None


# --------------------------------------------------------------------------- records



def save(state: TrainState) -> None:
    if state.dist.is_main and state.last_saved != state.step:
        save_snapshot(state.args.out / snapshot_name(state.step), state.raw_model,
                      state.corpus.tokenizer, step=state.step, tokens_seen=state.tokens,
                      train_config=state.tc, optimizer=state.optimizer)
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
    with progress(state) as bar:
        while state.step < last and not state.stop_requested():
            log_now = is_due(state.step + 1, tc["log_every"], last)
            eval_now = is_due(state.step + 1, tc["eval_every"], last)
            loss, table, grad_norm = train_step(state, measure=(log_now or eval_now) and dist.is_main)
            state.step, state.tokens, n = state.step + 1, state.tokens + per_step, n + 1
            first_bad = torch.where((first_bad < 0) & ~torch.isfinite(loss), state.step, first_bad)
            loss_sum += loss.float()
            bar.update(1)
            if log_now or eval_now:
                mean_loss = float(loss_sum) / n  # syncs the device
                record = {"step": state.step, "tokens": state.tokens, "lr": lr_at(state.step - 1, tc),
                          "train_loss": dist.mean(mean_loss),
                          "step_time_ms": 1000 * (time.perf_counter() - t0) / n}
                if dist.is_main:
                    record.update({"grad_norm": grad_norm, "gwu": table})
                    write_record(state, record, eval_now, first_bad=int(first_bad))
                loss_sum.zero_()
                n = 0
                if dist.mean(float("diverged" in record)) > 0 and on_divergence(state, record):
                    break
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


def lock_run_dir(args: argparse.Namespace, dist: DistInfo) -> RunLock | None:
    """Rank 0 locks --out for the whole training (a second writer is refused), then cleans up
    what killed saves left there."""
    if not dist.is_main:
        return None
    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out} exists and is not a directory")
    created = not args.out.exists()
    args.out.mkdir(parents=True, exist_ok=True)
    lock = RunLock(args.out)
    lock.created_dir = created
    lock.acquire()
    clean_leftovers(args.out)
    return lock


def train(args: argparse.Namespace) -> int:
    dist = init_distributed(args.device)
    lock = None
    try:
        lock = lock_run_dir(args, dist)
        state = setup(args, dist)
        state.bf16 = state.tc["dtype"] == "bf16"
        state.make_val_blocks()
        wrap_model(state)
        if dist.is_main:
            if state.resumed_from is not None:
                trim_metrics(args.out, state.step)
            write_run_json_for(state)  # after every check: a failed --resume appends nothing
            if state.resumed_from is not None:
                state.last_saved = state.step
            else:
                (args.out / METRICS_FILE).unlink(missing_ok=True)  # stale, from a run with no snapshot
                write_record(state, {"step": 0, "tokens": 0, "lr": lr_at(0, state.tc)}, True)
                save(state)
        log.info("training %s on %s for %d steps (%s)", state.tc["preset"], state.device,
                 state.tc["steps"], "resumed at step %d" % state.step if state.step else "fresh")
        with state.signals():
            run_steps(state)
        save(state)
        dump_rank_state(state)
        if state.diverged_at is not None and not state.args.keep_going:
            record = next((r for r in reversed(read_metrics(args.out)) if r.get("diverged")), {})
            log.error("training diverged at step %d: %s. Saved %s; lower --lr, add a norm "
                      "(--set norm=rms) or pass --keep-going", state.diverged_at,
                      describe_divergence(record), snapshot_name(state.diverged_at))
            return EXIT_DIVERGED
        if state.interrupted:
            log.warning("interrupted at step %d: saved %s", state.step, snapshot_name(state.step))
            return EXIT_INTERRUPTED
        log.info("training finished at step %d", state.step)
        return 0
    finally:
        if lock is not None:
            lock.release()
        dist.close()


def dump_rank_state(state: TrainState) -> None:
    """Tests of DDP: with $SCRATCHSCOPE_RANK_STATE_DIR set, every rank saves its final weights."""
    directory = os.environ.get(RANK_DUMP_ENV)
    if directory:
        from safetensors.torch import save_file

        tensors = {k: v.detach().cpu().contiguous() for k, v in state.raw_model.state_dict().items()}
        save_file(tensors, str(Path(directory) / f"rank{state.dist.rank}.safetensors"))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = argv
    rank = int(os.environ.get("RANK", "0"))
    level = logging.WARNING if args.quiet or rank != 0 else logging.INFO
    logging.basicConfig(level=level, format="%(name)s | %(levelname)s | %(asctime)s | %(message)s",
                        datefmt="%Y-%m-%d %H:%M:%S")
    return run_cli(lambda: train(args))


if __name__ == "__main__":
    sys.exit(main())
