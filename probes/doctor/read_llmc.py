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
from typing import Any

from probes.doctor.log_file import Log, merge_steps
from probes.errors import ProbeInputError

__all__ = ["MAIN_LOG", "is_llmc_text", "read_llmc_log"]

MAIN_LOG = "main.log"
NUMBER = r"([-+]?(?:nan|inf|\d+(?:\.\d*)?(?:e[-+]?\d+)?))"
CU_STEP = re.compile(rf"^step\s+(\d+)/(\d+) \| loss\s+{NUMBER}.*?\| norm\s+{NUMBER}.*?"
                     rf"\| lr\s+{NUMBER} \|\s+{NUMBER} ms")
C_STEP = re.compile(rf"^step (\d+): train loss\s+{NUMBER} \(took {NUMBER} ms\)")
VAL = re.compile(rf"^val loss {NUMBER}$")
MAIN = re.compile(rf"^s:(\d+) (trl|tel|eval):{NUMBER}(?: lr:{NUMBER} norm:{NUMBER})?$")
VOCAB = re.compile(r"^(?:\| vocab_size V\s+\| (\d+)|vocab_size: (\d+))")
LR = re.compile(rf"^\| learning rate \(LR\)\s+\| {NUMBER}")
MAX_STEPS = re.compile(r"^\| max_steps\s+\| (\d+)")


def is_llmc_text(text: str) -> bool:
    """Whether a text log holds llm.c's step lines (printed, or main.log's)."""
    return any(CU_STEP.match(line) or C_STEP.match(line) or MAIN.match(line) for line in text.splitlines()[:400])


def read_llmc_log(path: Path, text: str | None = None) -> Log:
    """llm.c's printed log or main.log as a Log; ProbeInputError naming the file if it has no step lines."""
    if text is None:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as err:
            raise ProbeInputError(f"{path}: cannot read ({err.strerror})") from None
    entries: list[tuple[int, dict[str, Any]]] = []
    facts: dict[str, Any] = {"train": {"grad_clip": 1.0}, "model": {}}
    pending_val: list[float] = []
    last = -1
    for raw in text.splitlines():
        line = raw.strip()
        step, values = read_line(line, facts)
        if values is not None and "val_loss" in values and step is None:
            pending_val.append(values["val_loss"])
            continue
        if step is None:
            continue
        if pending_val:  # printed before this step's line: it is this step's
            entries.append((step, {"val_loss": pending_val.pop()}))
            pending_val.clear()
        entries.append((step, values))
        last = max(last, step)
    if pending_val:
        entries.append((last + 1, {"val_loss": pending_val[-1]}))
    if not any("train_loss" in v or "val_loss" in v for _, v in entries):
        raise ProbeInputError(f"{path}: no llm.c 'step N/M | loss X | ...' or 's:N trl:X' lines")
    what = "main.log" if path.name == MAIN_LOG else f"the llm.c log {path.name}"
    return Log(path, what, merge_steps(entries), facts["model"], facts["train"], "llmc")


def read_line(line: str, facts: dict[str, Any]) -> tuple[int | None, dict[str, Any] | None]:
    """(0-based step or None, our values) of one line; set-up lines fill `facts`."""
    if match := CU_STEP.match(line):
        facts["train"]["steps"] = int(match[2])
        return int(match[1]) - 1, {"train_loss": num(match[3]), "grad_norm": num(match[4]), "lr": num(match[5]),
                                   "step_time_ms": num(match[6])}
    if match := C_STEP.match(line):
        return int(match[1]), {"train_loss": num(match[2]), "step_time_ms": num(match[3])}
    if match := VAL.match(line):
        return None, {"val_loss": num(match[1])}
    if match := MAIN.match(line):
        step, kind = int(match[1]), match[2]
        if kind == "trl":
            values = {"train_loss": num(match[3])}
            if match[4] is not None:
                values.update(lr=num(match[4]), grad_norm=num(match[5]))
            return step, values
        return step, ({"val_loss": num(match[3])} if kind == "tel" else {})
    if match := VOCAB.match(line):
        facts["model"]["d_vocab"] = int(match[1] or match[2])
    elif match := LR.match(line):
        facts["train"]["lr"] = num(match[1])
    elif (match := MAX_STEPS.match(line)) and int(match[1]) > 0:
        facts["train"].setdefault("steps", int(match[1]))
    return None, None


def num(text: str) -> float:
    return float(text.lower().replace("-nan", "nan"))
