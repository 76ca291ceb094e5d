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

The file is streamed a piece at a time, its step lines read by column in numpy (probes.doctor.
line_block), every other line one at a time (`LlmcLog.line`), with the same records as reading
every line so (tests/test_doctor_fast_read_llmc.py). main.log's lines and the printed ones are
kept apart: a file holding both (main.log with a run's stdout appended) is read by the kind it
holds more step lines of, and the source says so (`mixed`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from probes.doctor.line_block import Shapes, classify, line_ends
from probes.doctor.log_file import Log
from probes.doctor.printed_runs import NUMBER, PrintedRuns, step_number
from probes.doctor.text_log import TextLog
from probes.doctor.thin_columns import Rows
from probes.errors import ProbeInputError

__all__ = ["MAIN_LOG", "LlmcLog", "is_llmc_line", "is_llmc_text", "read_llmc_log"]

MAIN_LOG = "main.log"
CU_STEP = re.compile(rf"^step\s+(\d+)/(\d+) \| loss\s+{NUMBER}.*?\| norm\s+{NUMBER}.*?"
                     rf"\| lr\s+{NUMBER} \|\s+{NUMBER} ms")
C_STEP = re.compile(rf"^step (\d+): train loss\s+{NUMBER} \(took {NUMBER} ms\)")
VAL = re.compile(rf"^val loss {NUMBER}$")
MAIN = re.compile(rf"^s:(\d+) (trl|tel|eval):{NUMBER}(?: lr:{NUMBER} norm:{NUMBER})?$")
VOCAB = re.compile(r"^(?:\| vocab_size V\s+\| (\d+)|vocab_size: (\d+))")
LR = re.compile(rf"^\| learning rate \(LR\)\s+\| {NUMBER}")
MAX_STEPS = re.compile(r"^\| max_steps\s+\| (\d+)")
NANOGPT = re.compile(rf"iter \d+: loss {NUMBER}, time|step \d+: train loss {NUMBER}, val loss {NUMBER}")

# the lines read by column: whole lines as CU_STEP, C_STEP, VAL and MAIN match them once stripped
CU, C, TRL, TEL, VALUE = 1, 2, 3, 4, 5
SHAPES = Shapes({
    CU: (re.compile(CU_STEP.pattern[1:].replace(r"(\d+)", r"(\d{1,15})") + ".*"), (1, 2, 3, 4, 5, 6)),
    C: (re.compile(C_STEP.pattern[1:].replace(r"(\d+)", r"(\d{1,15})") + r"\s*"), (1, 2, 3)),
    TRL: (re.compile(rf"s:(\d{{1,15}}) trl:{NUMBER} lr:{NUMBER} norm:{NUMBER}\s*"), (1, 2, 3, 4)),
    TEL: (re.compile(rf"s:(\d{{1,15}}) tel:{NUMBER}\s*"), (1, 2)),
    VALUE: (re.compile(rf"val loss {NUMBER}\s*"), (1,)),
}, b"sv")
# what each kind's columns are, in our names (after the step; a val loss line has no step)
COLUMNS = {CU: (None, "train_loss", "grad_norm", "lr", "step_time_ms"), C: ("train_loss", "step_time_ms"),
           TRL: ("train_loss", "lr", "grad_norm"), TEL: ("val_loss",)}
PRINTED, MAINS = "printed", "main.log"  # the two kinds of lines, read apart


def is_llmc_line(line: str) -> bool:
    return bool(CU_STEP.match(line) or C_STEP.match(line) or MAIN.match(line))


def is_llmc_text(lines: Iterable[str]) -> bool:
    """Whether a text log's first lines hold llm.c's step lines (printed, or main.log's)."""
    return any(is_llmc_line(line) for line in lines)


def read_llmc_log(path: Path, encoding: str | None = None) -> Log:
    """llm.c's printed log or main.log as a Log (its last run, when several were appended: see
    probes.doctor.printed_runs), streamed; ProbeInputError naming the file if it has no step lines."""
    reader = LlmcLog(path, encoding)
    for number, piece in reader.text.pieces():
        reader.piece(number, piece)
    reader.text.warn()
    return reader.finish()


class LlmcLog:
    """One llm.c log being read: main.log's lines and the printed ones each into their own runs."""

    def __init__(self, path: Path, encoding: str | None = None):
        self.path, self.text = path, TextLog(path, encoding)
        self.runs = {PRINTED: PrintedRuns(path), MAINS: PrintedRuns(path)}
        self.counts = {PRINTED: 0, MAINS: 0, "nanoGPT": 0}  # step lines of each kind seen
        self.pending_val: float | None = None  # a printed val loss waiting for its step's line

    # ------------------------------------------------------------------ one line at a time

    def line(self, number: int, raw: str) -> None:
        """One line, stripped, as the reader has always taken it."""
        line = raw.strip()
        runs = self.runs[MAINS if line.startswith("s:") else PRINTED]
        if line.startswith(("+-", "| ")):  # the set-up table printed before the first step
            runs.setup(number)
        step, values = read_line(line, runs)
        if values is None:
            if NANOGPT.search(line):
                self.counts["nanoGPT"] += 1
            return
        self.counts[MAINS if runs is self.runs[MAINS] else PRINTED] += 1
        if step is None:
            if "val_loss" in values:
                self.pending_val = values["val_loss"]
            else:
                runs.step(number, None, {})  # a step number too long to read: counted
            return
        if self.pending_val is not None and runs is self.runs[PRINTED]:  # printed before this step's line
            runs.step(number, step, {"val_loss": self.pending_val})
            self.pending_val = None
        if values:
            runs.step(number, step, values)

    # ------------------------------------------------------------------ a piece at a time

    def piece(self, number: int, piece: str) -> None:
        """A piece of whole lines from line `number`, as line() would take each: runs of step lines
        of one kind by column (a val loss just before its step's line joining that line's
        record), the others one at a time."""
        data = np.frombuffer(piece.encode("utf-8", "surrogatepass"), dtype=np.uint8)
        starts, ends = line_ends(data)
        kinds, values = classify(data, starts, ends - starts, SHAPES)
        vals = paired_evals(kinds, values)  # step line -> the val loss just before it (kinds there now -1)
        rows = np.flatnonzero(kinds >= 0)
        change = np.flatnonzero(np.diff(kinds[rows].astype(np.int16), prepend=-1, append=-1)) if len(rows) else []
        for a, b in zip(change[:-1].tolist(), change[1:].tolist()):  # runs of one kind of line
            kind = int(kinds[rows[a]])
            if kind:
                self.block(number, kind, rows[a:b], values, vals)
                continue
            for at in rows[a:b].tolist():
                raw = data[starts[at]:ends[at] + 1].tobytes().decode("utf-8", "surrogatepass")
                for n, kept in self.text.lines(number + at, raw):
                    self.line(n, kept)

    def block(self, number: int, kind: int, rows: np.ndarray, values: np.ndarray, vals: dict[int, float]) -> None:
        """Step lines of one kind (`rows` of the piece from line `number`: [line field] values,
        `vals` the val losses paired with some). Each stretch of steps in order is one block; its
        first line, where a new segment or a pending val loss may begin, is taken as line() takes
        it, and so is a CU line's total steps (each line sets it: the last one's stays)."""
        family = MAINS if kind in (TRL, TEL) else PRINTED
        runs, names, values = self.runs[family], COLUMNS[kind], values[rows]
        has_val = np.isin(rows, np.fromiter(vals, dtype=np.int64, count=len(vals)))
        self.counts[family] += len(rows) + int(has_val.sum())
        steps = values[:, 0].astype(np.int64) - (1 if kind == CU else 0)
        cuts = [0] + (np.flatnonzero(steps[1:] <= steps[:-1]) + 1).tolist() + [len(rows)]
        for a, b in zip(cuts[:-1], cuts[1:]):
            if kind == CU:
                runs.fact("train", "steps", int(values[a, 1]))
            row = int(rows[a])
            val = vals.get(row, self.pending_val if family == PRINTED else None)
            if val is not None:  # on its own line (main.log's tel) or on the step's (as line() takes a pending one)
                runs.step(number + row - (row in vals and kind == TRL), int(steps[a]), {"val_loss": val})
                self.pending_val = None if family == PRINTED else self.pending_val
            runs.step(number + int(rows[a]), int(steps[a]), row_values(names, values[a, 1:]))
            if b - a > 1:
                columns = {name: values[a + 1:b, j + 1] for j, name in enumerate(names) if name}
                held = {i - a - 1: {"step": int(steps[i]), "val_loss": vals[int(rows[i])],
                                    **row_values(names, values[i, 1:])}
                        for i in (np.flatnonzero(has_val[a + 1:b]) + a + 1).tolist()}
                runs.steps_read(number + rows[a + 1:b], Rows(steps[a + 1:b], columns, held), {})
                if kind == CU:
                    runs.fact("train", "steps", int(values[b - 1, 1]))

    # ------------------------------------------------------------------ the whole log

    def finish(self) -> Log:
        """The Log of the kind of lines it holds most of (main.log's or the printed ones)."""
        printed = self.runs[PRINTED]
        if self.pending_val is not None and printed.records:
            printed.step(0, printed.records[-1]["step"] + 1, {"val_loss": self.pending_val})
        family = MAINS if self.counts[MAINS] > self.counts[PRINTED] else PRINTED
        runs = self.runs[family]
        if not any("train_loss" in r or "val_loss" in r for r in runs.records):
            raise ProbeInputError(f"{self.path}: no llm.c 'step N/M | loss X | ...' or 's:N trl:X' lines")
        if family == MAINS:  # the set-up table is printed: its vocab size and rate say what main.log does not
            for where in ("model", "train"):
                for key, value in printed.facts[where].items():
                    runs.facts[where].setdefault(key, value)
        runs.facts["train"]["grad_clip"] = 1.0
        what = "main.log" if self.path.name == MAIN_LOG else f"the llm.c log {self.path.name}"
        facts = runs.facts
        records, source = runs.finish(what)
        skipped = len(self.runs[PRINTED].long_numbers) + len(self.runs[MAINS].long_numbers) + self.text.overlong
        return Log(self.path, source, records, facts["model"], facts["train"], "llmc", skipped=skipped,
                   formats=self.formats(family))

    def formats(self, family: str) -> dict[str, int]:
        """Step lines of each kind the file holds, the kind read first (what `mixed` tells)."""
        kinds = {"llm.c main.log" if family == MAINS else "llm.c": self.counts[family]}
        other = PRINTED if family == MAINS else MAINS
        if self.counts[other]:
            kinds["llm.c main.log" if other == MAINS else "llm.c printed"] = self.counts[other]
        if self.counts["nanoGPT"]:
            kinds["nanoGPT"] = self.counts["nanoGPT"]
        return kinds


def paired_evals(kinds: np.ndarray, values: np.ndarray) -> dict[int, float]:
    """{row: val loss} for each val loss line just before a step line it belongs to (a printed
    `val loss X` before a CU or C line, `s:N tel:X` before `s:N trl:...` of its step): those eval
    lines' kinds set to -1 (read with their step line); the others' to 0 (read one at a time)."""
    out: dict[int, float] = {}
    for eval_kind, step_kinds in ((VALUE, (CU, C)), (TEL, (TRL,))):
        at = np.flatnonzero(kinds == eval_kind)
        nxt = np.minimum(at + 1, len(kinds) - 1)
        paired = (at + 1 < len(kinds)) & np.isin(kinds[nxt], step_kinds)
        if eval_kind == TEL:
            paired &= values[nxt, 0] == values[at, 0]
        kinds[at] = np.where(paired, -1, 0 if eval_kind == VALUE else kinds[at])
        out.update(zip((at[paired] + 1).tolist(), values[at[paired], 0 if eval_kind == VALUE else 1].tolist()))
    return out


def row_values(names: tuple[str | None, ...], values: np.ndarray) -> dict[str, float]:
    return {name: float(v) for name, v in zip(names, values.tolist()) if name}


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
