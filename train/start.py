"""How a training starts: the run directory locked and checked, a resumed run's recipe and optimizer
state restored (or refused), the model built and wrapped for torch.compile / DDP."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import torch

from models import PRESETS, build_model
from models.checkpoint import (latest_snapshot, list_snapshots, load_optimizer_state, load_snapshot,
                               resolve_device)
from models.packed_heads import pack_optimizer_state
from models.store.files import writing
from models.store.run import read_run_json
from train.args import BPE_VOCAB
from train.args import parse_sets
from train.config import DistInfo, build_optimizer, lr_at, model_config
from train.hyper import resolve_train_config
from train.data import check_length, load_corpus
from train.run_lock import RunLock, check_optimizer_state, clean_leftovers
from train.state import TrainState

log = logging.getLogger("train")


def lock_run_dir(args: argparse.Namespace, dist: DistInfo) -> RunLock | None:
    """Rank 0 locks --out for the whole training (a second writer is refused), then cleans up
    what killed saves left there."""
    if not dist.is_main:
        return None
    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out} exists and is not a directory")
    created = not args.out.exists()
    with writing(args.out):
        args.out.mkdir(parents=True, exist_ok=True)
    lock = RunLock(args.out)
    lock.created_dir = created
    lock.acquire()
    clean_leftovers(args.out)
    return lock


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
        raise fixed_by_run("--preset", args.preset, f"it was trained as preset {saved['preset']}")
    preset = args.preset or saved.get("preset")
    if snap is None and preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of: {', '.join(PRESETS)}")
    tc = resolve_train_config(args, PRESETS[preset].train if preset in PRESETS else {}, saved)
    if snap and saved.get("steps") not in (None, tc["steps"]) and tc["schedule"] == "cosine":
        check_new_horizon(args, saved, tc, int(snap.step or 0))
    return preset, {**tc, "preset": preset}


def fixed_by_run(flag: str, given: Any, run_has: str) -> ValueError:
    """A flag naming what the resumed run already fixes, with another value: refused (one rule for
    every such flag: --preset, --set, --tokenizer, --bpe-vocab); its own value is accepted."""
    return ValueError(f"--resume: {flag} {given} would change what the run fixes ({run_has}); leave "
                      f"{flag} out to continue it, or train a new run with another --out")


def refuse_changes_to_the_run(args: argparse.Namespace, snap: Any) -> None:
    """--set, --tokenizer and --bpe-vocab on --resume: the run's model and tokenizer are fixed."""
    config = snap.config
    for key, value in parse_sets(config, args.set).items():
        if getattr(config, key) != value:
            raise fixed_by_run("--set", f"{key}={value}", f"its model has {key}={getattr(config, key)}")
    kind = getattr(snap.tokenizer, "kind", None)
    if args.tokenizer not in (None, kind):
        raise fixed_by_run("--tokenizer", args.tokenizer, f"the {kind} tokenizer")
    if args.bpe_vocab is not None and (kind != "bpe" or args.bpe_vocab != snap.tokenizer.vocab_size):
        size = f" of {snap.tokenizer.vocab_size} pieces" if snap.tokenizer is not None else ""
        raise fixed_by_run("--bpe-vocab", args.bpe_vocab, f"the {kind} tokenizer{size}")


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
    state = pack_optimizer_state(state, optimizer, snap.model)  # saved before heads were packed?
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
    if snap is not None:
        refuse_changes_to_the_run(args, snap)
    elif args.bpe_vocab is not None and args.tokenizer != "bpe":
        raise ValueError(f"--bpe-vocab {args.bpe_vocab} applies to --tokenizer bpe only (this run's is "
                         f"{args.tokenizer or 'char'}): leave it out, or add --tokenizer bpe")
    args.tokenizer = args.tokenizer or "char"
    preset, tc = recipe(args, snap)
    if tc["warmup"] >= tc["steps"]:
        log.warning("--warmup %d is not shorter than the run (--steps %d): the learning rate never "
                    "reaches %g; lower --warmup (the gpt2_124m recipe warms up for 715 steps)",
                    tc["warmup"], tc["steps"], tc["lr"])
    corpus = load_corpus(args.data, args.tokenizer, tc["val_fraction"], bpe_vocab=args.bpe_vocab or BPE_VOCAB,
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
