"""karpathy/llm.c's histories read into our records: its printed log (`./train_gpt2cu ... | tee
train.log`, or train_gpt2.c's) and the `main.log` its logger writes in the -o output directory.

The printed lines are those of train_gpt2.cu and train_gpt2.c:
    step %4d/%d | loss %7.6f (%+.2fz)| norm %6.4f (%+.2fz)| lr %.2e | %.2f ms | ...   (step + 1, of N)
    step %d: train loss %f (took %f ms)                                          (train_gpt2.c: step)
    val loss %f                                                                 (before that step's line)
    | vocab_size V          | 50257 |      | learning rate (LR)    | 3.000000e-04 |
and llmc/logger.h's main.log lines, each at the 0-based step:
    s:%d trl:%.4f lr:%.6f norm:%.2f      s:%d tel:%.4f      s:%d eval:%.4f (HellaSwag, not a loss)
A step's printed number in train_gpt2.cu is step + 1; it is read as the 0-based step, as main.log
writes it, so the two agree. A val loss line belongs to the step whose line follows it (the last
one, printed after the final step, to the step after the last). NaN prints as `nan` or `-nan`.
llm.c clips gradients at 1.0 (`float grad_clip = 1.0f`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable

from probes.doctor.log_file import Log
from probes.doctor.printed_runs import NUMBER, PrintedRuns, step_number
from probes.doctor.text_log import text_lines
from probes.errors import ProbeInputError

__all__ = ["MAIN_LOG", "is_llmc_text", "read_llmc_log"]

MAIN_LOG = "main.log"
CU_STEP = re.compile(rf"^step\s+(\d+)/(\d+) \| loss\s+{NUMBER}.*?\| norm\s+{NUMBER}.*?"
                     rf"\| lr\s+{NUMBER} \|\s+{NUMBER} ms")
C_STEP = re.compile(rf"^step (\d+): train loss\s+{NUMBER} \(took {NUMBER} ms\)")
VAL = re.compile(rf"^val loss {NUMBER}$")
MAIN = re.compile(rf"^s:(\d+) (trl|tel|eval):{NUMBER}(?: lr:{NUMBER} norm:{NUMBER})?$")
VOCAB = re.compile(r"^(?:\| vocab_size V\s+\| (\d+)|vocab_size: (\d+))")
LR = re.compile(rf"^\| learning rate \(LR\)\s+\| {NUMBER}")
MAX_STEPS = re.compile(r"^\| max_steps\s+\| (\d+)")


def is_llmc_text(lines: Iterable[str]) -> bool:
    """Whether a text log's first lines hold llm.c's step lines (printed, or main.log's)."""
    return any(CU_STEP.match(line) or C_STEP.match(line) or MAIN.match(line) for line in lines)


def read_llmc_log(path: Path, encoding: str | None = None) -> Log:
    """llm.c's printed log or main.log as a Log (its last run, when several were appended: see
    probes.doctor.printed_runs), streamed; ProbeInputError naming the file if it has no step lines."""
    runs = PrintedRuns(path)
    runs.facts["train"]["grad_clip"] = 1.0
    pending_val: float | None = None
    for number, raw in text_lines(path, encoding):
        line = raw.strip()
        if line.startswith(("+-", "| ")):  # the set-up table printed before the first step
            runs.setup(number)
        step, values = read_line(line, runs)
        if values is None:
            continue
        if step is None:
            if "val_loss" in values:
                pending_val = values["val_loss"]
            else:
                runs.step(number, None, {})  # a step number too long to read: counted
            continue
        if pending_val is not None:  # printed before this step's line: it is this step's
            runs.step(number, step, {"val_loss": pending_val})
            pending_val = None
        if not values:
            continue
        runs.step(number, step, values)
    if pending_val is not None and runs.records:
        runs.step(0, runs.records[-1]["step"] + 1, {"val_loss": pending_val})
    if not any("train_loss" in r or "val_loss" in r for r in runs.records):
        raise ProbeInputError(f"{path}: no llm.c 'step N/M | loss X | ...' or 's:N trl:X' lines")
    what = "main.log" if path.name == MAIN_LOG else f"the llm.c log {path.name}"
    facts = runs.facts
    records, source = runs.finish(what)
    return Log(path, source, records, facts["model"], facts["train"], "llmc", skipped=len(runs.long_numbers))


def read_line(line: str, runs: PrintedRuns) -> tuple[int | None, dict[str, Any] | None]:
    """(0-based step or None, our values) of one line; set-up lines add to the run's facts. A step
    number too long to be one gives (None, {})."""
    if match := CU_STEP.match(line):
        step = step_number(match[1])
        if step is None:
            return None, {}
        if (steps := step_number(match[2])) is not None:
            runs.fact("train", "steps", steps)
        return step - 1, {"train_loss": num(match[3]), "grad_norm": num(match[4]), "lr": num(match[5]),
                          "step_time_ms": num(match[6])}
    if match := C_STEP.match(line):
        step = step_number(match[1])
        return (None, {}) if step is None else (step, {"train_loss": num(match[2]), "step_time_ms": num(match[3])})
    if match := VAL.match(line):
        return None, {"val_loss": num(match[1])}
    if match := MAIN.match(line):
        step, kind = step_number(match[1]), match[2]
        if step is None:
            return None, {}
        if kind == "trl":
            values = {"train_loss": num(match[3])}
            if match[4] is not None:
                values.update(lr=num(match[4]), grad_norm=num(match[5]))
            return step, values
        return step, ({"val_loss": num(match[3])} if kind == "tel" else {})
    if (match := VOCAB.match(line)) and (vocab := step_number(match[1] or match[2])) is not None:
        runs.fact("model", "d_vocab", vocab)
    elif match := LR.match(line):
        runs.fact("train", "lr", num(match[1]))
    elif (match := MAX_STEPS.match(line)) and (steps := step_number(match[1])) is not None and steps > 0:
        target = runs.pending if runs.pending is not None else runs.facts
        target["train"].setdefault("steps", steps)
    return None, None


def num(text: str) -> float:
    return float(text.lower().replace("-nan", "nan"))
