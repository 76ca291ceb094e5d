"""nanoGPT's printed log (`python train.py ... | tee train.log`) read into our records.

The lines are those karpathy/nanoGPT's train.py prints:
    iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms, mfu {running_mfu*100:.2f}%
    step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}
    tokens per iteration will be: {tokens_per_iter:,}
    found vocab_size = {meta_vocab_size} (inside {meta_path})
    defaulting to vocab_size of GPT-2 to 50304 (50257 rounded up for efficiency)
and the configurator's echo of the config (`max_iters = 5000`, `Overriding: learning_rate = 0.01`).
A diverged run prints `nan`, read as NaN. The eval line's train loss (a mean over eval_iters
batches) is the better estimate, so it wins over the iter line's at the same step; the iter line's
step time is kept. A last line cut mid-print (the run was killed) is skipped. The file is streamed
(probes.doctor.text_log: UTF-8 or UTF-16, never whole in memory); a second run appended to it is
told apart (probes.doctor.printed_runs).
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path

from models.store.run import checkpoint_files
from probes.doctor.log_file import Log
from probes.doctor.printed_runs import NUMBER, PrintedRuns, step_number
from probes.doctor.read_llmc import is_llmc_line, read_llmc_log
from probes.doctor.nanogpt_block import read_piece
from probes.doctor.text_log import TextLog
from probes.errors import ProbeInputError

__all__ = ["find_nanogpt_log", "read_nanogpt_log"]

log = logging.getLogger(__name__)

ITER = re.compile(rf"iter (\d+): loss {NUMBER}, time {NUMBER}ms, mfu {NUMBER}%$")
EVAL = re.compile(rf"step (\d+): train loss {NUMBER}, val loss {NUMBER}$")
TOKENS = re.compile(r"tokens per iteration will be: ([\d,]+)$")
VOCAB = re.compile(r"found vocab_size = (\d+)|defaulting to vocab_size of GPT-2 to (\d+)|forcing vocab_size=(\d+)")
# the configurator's echo of a config file or a --key=value override -> (ours, where)
CONFIG = re.compile(r"^(?:Overriding: )?(\w+) = ([-+0-9.e]+)\s*(?:#.*)?$")
SAVE_BEST = re.compile(r"^(?:Overriding: )?always_save_checkpoint = (True|False)\s*(?:#.*)?$")
# a run's set-up lines besides the config echo: a second of these after step lines is a new segment
SETUP = re.compile(r"^(?:Overriding config with |Initializing a new model from scratch|Resuming training from |"
                   r"Initializing from OpenAI GPT-2 weights|number of parameters: )")
CONFIG_KEYS = {"max_iters": ("steps", "train"), "learning_rate": ("lr", "train"),
               "log_interval": ("log_every", "train"), "grad_clip": ("grad_clip", "train"),
               "block_size": ("n_ctx", "model"),
               "n_layer": ("n_layers", "model"), "n_head": ("n_heads", "model"), "n_embd": ("d_model", "model")}


def find_nanogpt_log(path: Path) -> Path | None:
    """The `*.log` beside a nanoGPT checkpoint: `path` is a ckpt.pt file or the folder holding
    ckpt.pt (or ckpt_N.pt files). The newest when there are several; None when there is none."""
    folder = path.parent if path.is_file() else path
    if not ((folder / "ckpt.pt").is_file() or path.suffix == ".pt" or checkpoint_files(folder)):
        return None
    logs = sorted((p for p in folder.glob("*.log") if p.is_file()), key=lambda p: p.stat().st_mtime)
    if len(logs) > 1:
        log.info("%s: %d *.log files; reading the newest, %s", folder, len(logs), logs[-1].name)
    return logs[-1] if logs else None


def read_nanogpt_log(path: Path, encoding: str | None = None) -> Log:
    """nanoGPT's printed log as a Log (its last run, when `tee -a` appended several: see
    probes.doctor.printed_runs), streamed a piece at a time (probes.doctor.nanogpt_block); ProbeInputError (one line naming the
    file) if it has no iter or step lines."""
    runs = PrintedRuns(path, keep=("train_loss",))
    text = TextLog(path, encoding)
    for number, piece in text.pieces():
        read_piece(number, piece, runs, text, read_line)
    text.warn()
    formats = {"nanoGPT": runs.lines, **({"llm.c": runs.others} if runs.others else {})}
    if runs.first_step is None and runs.others:  # llm.c's lines past the head that told the format
        return read_llmc_log(path, encoding)
    if runs.first_step is None:
        raise ProbeInputError(f"{path}: no nanoGPT 'iter N: loss X, ...' or 'step N: train loss X, "
                              "val loss Y' lines, nor llm.c's 'step N/M | loss X | ...' or 's:N trl:X' "
                              "(is it the printed output of nanoGPT's or llm.c's training?)"
                              + (f"; {len(runs.long_numbers)} had a step number too long to read"
                                 if runs.long_numbers else ""))
    facts = runs.facts
    records, source = runs.finish(f"the nanoGPT log {path.name}")
    per_step = facts["train"].pop("tokens_per_step", None)
    if isinstance(per_step, int) and per_step > 0:
        for r in records:
            r["tokens"] = per_step * r["step"]
    return Log(path, source, records, facts["model"], facts["train"], "nanogpt",
               skipped=len(runs.long_numbers) + text.overlong, formats=formats)


def read_line(number: int, line: str, runs: PrintedRuns) -> None:
    """One printed line into `runs`: a step's losses (the eval line's train loss, a mean over
    eval_iters batches, is the better one), or a set-up fact."""
    if "iter " in line and (match := ITER.search(line)):
        runs.lines += 1
        runs.step(number, step_number(match[1]), {"train_loss": float(match[2]), "step_time_ms": float(match[3])})
    elif "step " in line and (match := EVAL.search(line)):
        runs.lines += 1
        runs.step(number, step_number(match[1]), {"train_loss": float(match[2]), "val_loss": float(match[3])},
                  better=True)
    elif match := TOKENS.search(line):
        runs.setup(number)
        runs.fact("train", "tokens_per_step", config_number(match[1].replace(",", "")))
    elif match := VOCAB.search(line):
        runs.setup(number)
        vocab = config_number(next(g for g in match.groups() if g))
        if isinstance(vocab, int):
            runs.fact("model", "d_vocab", vocab)
    elif SETUP.match(line):
        runs.setup(number)
        if line.startswith("Resuming training"):
            runs.resumes(number)
    elif match := SAVE_BEST.match(line):  # False: ckpt.pt is saved only when the val loss improves
        runs.setup(number)
        runs.fact("train", "keeps_best", match[1] == "False")
    elif (match := CONFIG.match(line)) and match[1] in CONFIG_KEYS:
        runs.setup(number)
        name, where = CONFIG_KEYS[match[1]]
        value = config_number(match[2])
        if value is not None:
            runs.fact(where, name, value)
    elif line.startswith(("step ", "s:")) and is_llmc_line(line):  # llm.c's: counted, not read
        runs.others += 1


def config_number(text: str) -> int | float | None:
    """A config value as printed; None for what is no finite number (or too long to be one)."""
    if len(text) > 40:
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None
