"""Which history a path holds: our run directory (metrics.jsonl), a Hugging Face Trainer output
directory or checkpoint-N/ (trainer_state.json), nanoGPT's printed log beside its ckpt.pt, llm.c's
main.log, TensorBoard event files or a W&B run folder; or a log file named with --log (a printed
log is llm.c's when it holds llm.c's step lines, else nanoGPT's). Each foreign one is read into a `Log`; a Git
LFS pointer where a log should be is named as such.

Checked in that order: a run directory of ours is read as ours even when it also holds event
files, and a Trainer's trainer_state.json before the TensorBoard events it writes beside it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterable

from models.store.run import (METRICS_FILE, CheckpointError, is_run_dir, is_snapshot_dir, read_json_object,
                              snapshot_step)
from probes.doctor.log_file import Log, check_not_lfs_pointer, user_tags
from probes.doctor.read_llmc import MAIN_LOG, is_llmc_text, read_llmc_log
from probes.doctor.read_nanogpt import find_nanogpt_log, read_nanogpt_log
from probes.doctor.read_tensorboard import EVENTS_PREFIX, SUBFOLDER_DEPTH, find_event_folder, read_tensorboard
from probes.doctor.read_trainer import STATE_FILE, find_trainer_state, read_trainer_state
from probes.doctor.read_wandb import find_wandb_run, read_wandb, read_wandb_file
from probes.doctor.text_log import check_regular_file, head_lines, text_encoding
from probes.errors import ProbeInputError

__all__ = ["EXPECTED", "find_log", "locate", "read_log_file", "snapshot_alone"]

log = logging.getLogger(__name__)

Tags = Iterable[str] | dict[str, str] | None
LLMC_HEAD = 400  # lines in which llm.c's step lines are looked for

EXPECTED = ("a run directory with metrics.jsonl, a Trainer output directory with trainer_state.json, "
            "TensorBoard event files, a W&B run folder, llm.c's main.log, or a nanoGPT or llm.c printed log via --log")
TEXT_LOGS = (".log", ".txt", ".out")
WANDB_SUFFIX = ".wandb"  # W&B's run-<id>.wandb
NANOGPT_CKPT = "ckpt.pt"  # what nanoGPT's train.py saves in its out_dir
NEEDS = ("the doctor reads what training logged: a run directory with metrics.jsonl (ours, or one written "
         "by train.monitor.Monitor in any training loop), a Trainer output directory, TensorBoard events, "
         "or a log given with --log FILE (nanoGPT's printed output, trainer_state.json)")


def snapshot_alone(path: Path) -> str:
    """For weights without their history (a snapshot copied out of its run, an imported model):
    what the path is, and what the doctor needs instead."""
    return f"{path}: {weights_kind(path)}, which holds weights but no training history; {NEEDS}"


def weights_kind(path: Path) -> str:
    """A few words for a checkpoint the doctor cannot read: ours, Hugging Face's, nanoGPT's or a .pt."""
    if path.is_file():
        return "nanoGPT's checkpoint with no *.log beside it" if path.name.startswith("ckpt") else "a .pt file"
    try:
        config = read_json_object(path / "config.json")
    except CheckpointError:
        config = {}
    if "model_type" in config and "format_version" not in config:
        return f"a Hugging Face {config['model_type']} model directory"
    return "a snapshot outside a run"


def find_log(ckpt: str | Path | None, log_file: str | Path | None = None, tags: Tags = None) -> Log | None:
    """The foreign log to diagnose (--log FILE, else what --ckpt PATH holds); None when PATH is a
    run directory of ours (or a snapshot inside one), which RunHistory reads itself."""
    if log_file is not None:
        if ckpt is not None and not Path(ckpt).exists():
            raise ProbeInputError(f"{ckpt}: no such file or directory")
        return read_log_file(Path(log_file), tags)
    if ckpt is None:
        raise ProbeInputError("nothing to diagnose: give --ckpt PATH or --log FILE")
    path = Path(ckpt)
    if not path.exists():
        raise ProbeInputError(f"{path}: no such file or directory")
    if not path.is_dir():
        check_regular_file(path, "a run or output directory, or a log file")
    found = read_log_file(path, tags) if path.is_file() else read_folder(path, tags)
    if found is None and user_tags(tags):
        raise ProbeInputError(f"{path}: --tag maps the names of a TensorBoard log or trainer_state.json; "
                              "this is a run directory with metrics.jsonl")
    return found


def read_log_file(path: Path, tags: Tags = None) -> Log:
    """One file: trainer_state.json, an event file or a nanoGPT log, told apart by its name; a
    nanoGPT ckpt.pt stands for the *.log beside it."""
    if path.is_dir():
        raise ProbeInputError(f"{path}: a directory; --log takes a log file (a folder goes to --ckpt)")
    check_regular_file(path)
    check_not_lfs_pointer(path)
    if path.name == STATE_FILE:
        return read_trainer_state(path, tags)
    if path.name.startswith(EVENTS_PREFIX):
        return read_tensorboard(path, tags)
    if path.suffix == WANDB_SUFFIX:
        return read_wandb_file(path, tags)
    if path.suffix == ".pt":
        beside = find_nanogpt_log(path)
        if beside is None:
            raise ProbeInputError(snapshot_alone(path))
        return printed(beside, tags)
    if path.suffix in TEXT_LOGS or path.name.endswith(".log"):
        return printed(path, tags)
    raise ProbeInputError(f"{path}: not a log the doctor reads: expected {EXPECTED}; found a "
                          f"{path.suffix or 'suffix-less'} file")


def read_folder(path: Path, tags: Tags) -> Log | None:
    found = locate(path)
    if found is not None:
        kind, where = found
        return READERS[kind](where, tags)
    if (path / METRICS_FILE).is_file() or in_a_run(path) or is_run_dir(path):
        return None  # ours (without metrics.jsonl yet: RunHistory says so)
    if is_snapshot_dir(path) or (path / NANOGPT_CKPT).is_file():
        raise ProbeInputError(snapshot_alone(path if is_snapshot_dir(path) else path / NANOGPT_CKPT))
    raise ProbeInputError(f"{path}: no history the doctor can read: expected {EXPECTED}; found {describe(path)}")


def locate(folder: Path, event_depth: int = SUBFOLDER_DEPTH) -> tuple[str, Path] | None:
    """(kind, what to read) of the foreign log a folder holds, without reading it: "trainer" and
    its trainer_state.json, "nanogpt" and the *.log beside ckpt.pt, "wandb" and a W&B run folder,
    "tensorboard" and the folder of event files (searched `event_depth` levels down); None for a run
    of ours or no log at all."""
    if not folder.is_dir() or (folder / METRICS_FILE).is_file() or in_a_run(folder):
        return None
    if (state := find_trainer_state(folder)) is not None:
        return "trainer", state
    if (beside := find_nanogpt_log(folder)) is not None:
        return "nanogpt", beside
    if (folder / MAIN_LOG).is_file():
        return "nanogpt", folder / MAIN_LOG  # llm.c's logger output (printed() tells which)
    if (run := find_wandb_run(folder)) is not None:  # before the events W&B copies in when it syncs TensorBoard
        return "wandb", run
    if (events := find_event_folder(folder, event_depth)) is not None:
        return "tensorboard", events
    return None


def printed(path: Path, tags: Tags) -> Log:
    """A printed log: llm.c's when it holds llm.c's step lines, else nanoGPT's; one that mixes the
    two is read as the one it holds more step lines of, and its source says so (`mixed`)."""
    if user_tags(tags):
        raise ProbeInputError(f"{path}: --tag maps the names of a TensorBoard log or trainer_state.json, "
                              "not the lines of a nanoGPT log or an llm.c log")
    check_regular_file(path)
    check_not_lfs_pointer(path)
    if path.stat().st_size == 0:
        raise ProbeInputError(f"{path}: an empty file: nothing was logged to it (yet)")
    encoding = text_encoding(path)
    if encoding not in ("utf-8", "utf-8-sig"):
        log.info("%s: read as %s", path, encoding.upper())
    llmc = is_llmc_text(head_lines(path, LLMC_HEAD, encoding))
    found = (read_llmc_log if llmc else read_nanogpt_log)(path, encoding)
    own, other = (sum(v for k, v in found.formats.items() if k.startswith("llm.c")), found.formats.get("nanoGPT", 0)) \
        if llmc else (found.formats.get("nanoGPT", 0), found.formats.get("llm.c", 0))
    if other > own:  # the other trainer's lines are the most: read those
        found = (read_nanogpt_log if llmc else read_llmc_log)(path, encoding)
    return mixed(found)


def mixed(found: Log) -> Log:
    """A log whose step lines come in more than one format says which it read, and what it left out."""
    if len(found.formats) < 2:
        return found
    (read, n), *others = found.formats.items()
    left = ", ".join(f"{m:,} {kind}" for kind, m in others) + " lines left out"
    why = "the most" if n > max(m for _, m in others) else "as many as the others: the format of its first lines"
    log.warning("%s: mixes formats: read its %s %s step lines (%s); %s", found.path, f"{n:,}", read, why, left)
    found.source += f" (it mixes formats: {n:,} {read} step lines read, {left})"
    return found


READERS = {"trainer": read_trainer_state, "nanogpt": printed, "tensorboard": read_tensorboard, "wandb": read_wandb}


def in_a_run(path: Path) -> bool:
    return is_snapshot_dir(path) and snapshot_step(path) is not None and is_run_dir(path.parent)


def describe(folder: Path) -> str:
    """What a folder holds, in a few words, for the error saying it is none of the expected."""
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir())
    if not names:
        return "an empty directory"
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return f"{len(names)} entr{'y' if len(names) == 1 else 'ies'}: {shown}"
