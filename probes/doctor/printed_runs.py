"""The runs of one printed log, told apart while it is streamed: `python train.py | tee -a
train.log` twice appends a second run to the first, and splicing their histories would judge one
run by the other's losses (a healthy lr 1e-3 run 'failed' for an earlier lr 100 run's NaN).

A run's set-up lines (a config echo, 'number of parameters', ...) after step lines open a new
segment. At its first step line, or wherever the step counter goes back, the segment is:
- a new run when its first step is at or before the current run's first step (the counter went
  back to 0, or to where the run began) and it did not say it resumes: what came before is left
  out, and the log's source says so ('its last run, from line N');
- a resume of the same run otherwise (nanoGPT's init_from='resume' restarts at its checkpoint's
  step; llm.c's -y 1 likewise): the steps from there on are the resumed run's, the ones it
  redid dropped as TensorBoard does with a restarted writer.
Records are kept in step order, one per step, later values of a step winning except where a
reader says its value is the better one (nanoGPT's eval-line train loss over its iter line's);
a long run's older records are merged into windows as it is read (probes.doctor.thinning).
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from probes.doctor.thin_columns import Rows
from probes.doctor.thinning import Thinned

__all__ = ["MAX_DIGITS", "NUMBER", "PrintedRuns", "step_number"]

log = logging.getLogger(__name__)

MAX_DIGITS = 18  # a step number longer than this is no step (and int() refuses 4300 digits)
# a printed float as a regex group, as C's printf and Python's format write one (`nan`, `-nan`, `inf`)
NUMBER = r"([-+]?(?:nan|inf|\d+(?:\.\d*)?(?:e[-+]?\d+)?))"


def step_number(text: str) -> int | None:
    """A printed step number as an int; None for one too long to be a step."""
    return int(text) if len(text) <= MAX_DIGITS else None


def fresh_facts() -> dict[str, Any]:
    return {"train": {}, "model": {}}


@dataclass
class PrintedRuns:
    """The last run of a printed log so far: its records in step order and its set-up facts."""

    path: Path
    records: Thinned = field(default_factory=Thinned)
    facts: dict[str, Any] = field(default_factory=fresh_facts)
    pending: dict[str, Any] | None = None  # set-up facts read after step lines: a new segment's
    pending_line: int = 0
    resuming: bool = False  # the new segment said it resumes ('Resuming training from ...')
    first_step: int | None = None
    runs_before: int = 0  # earlier runs in the file, left out
    start_line: int = 1  # where the run read begins
    long_numbers: list[int] = field(default_factory=list)  # lines skipped for a step number too long
    keep: tuple[str, ...] = ()  # keys whose value from a `better` line is not overwritten at its step
    lines: int = 0  # step lines of the reader's own format read (a reader counts them)
    others: int = 0  # step lines of another trainer's format, left out (a reader counts them)

    def setup(self, number: int) -> None:
        """Line `number` is part of a run's set-up: after step lines it opens a new segment."""
        if self.first_step is not None and self.pending is None:
            self.pending, self.pending_line, self.resuming = fresh_facts(), number, False

    def fact(self, where: str, name: str, value: Any) -> None:
        (self.pending if self.pending is not None else self.facts)[where][name] = value

    def resumes(self, number: int) -> None:
        self.setup(number)
        self.resuming = True

    def step(self, number: int, step: int | None, values: dict[str, Any], better: bool = False) -> None:
        """A step line's values; `better`: its `keep` keys win over other lines' at the same step."""
        records = self.records
        if not better and self.pending is None and records and step is not None and step > records[-1]["step"]:
            records.append({"step": step, **values})  # the common line: the next step, in order
            return
        if step is None:
            self.long_numbers.append(number)
            return
        if self.first_step is None:
            self.first_step = step
        last = self.records[-1]["step"] if self.records else None
        if self.pending is not None or (last is not None and step < last):
            self.new_segment(number, step)
        if self.records and self.records[-1]["step"] == step:
            record = self.records[-1]
            for key, value in values.items():
                if better or key not in self.keep or "_better" not in record or key not in record:
                    record[key] = value
            if better:
                record["_better"] = True
        else:
            self.records.append({"step": step, **values, **({"_better": True} if better else {})})

    def steps_read(self, numbers: np.ndarray, rows: Rows, evals: dict[int, tuple[int, dict[str, Any]]]) -> None:
        """Step lines read in a block: row i is line numbers[i]'s values, and for i in `evals`,
        (line, values) of a `better` line at the same step just before it. As step() takes each
        line in turn; the lines of the common stretch (the next steps, in order, within one
        segment) as a block, the eval and its step line as one record."""
        steps, n, i = rows.steps, len(rows), 0
        breaks = (np.flatnonzero(steps[1:] <= steps[:-1]) + 1).tolist() + [n]
        while i < n:
            records = self.records
            if self.pending is None and records and steps[i] > records[-1]["step"]:
                j = breaks[bisect.bisect_right(breaks, i)]
                records.extend(rows.part(i, j))
                i = j
                continue
            step = int(steps[i])
            if i in evals:
                self.step(evals[i][0], step, evals[i][1], better=True)
            self.step(int(numbers[i]), step, rows.values(i))
            i += 1

    def new_segment(self, number: int, step: int) -> None:
        pending, self.pending = self.pending, None
        if step <= self.first_step and not self.resuming:  # the counter went back to the start: a new run
            self.runs_before += 1
            self.records, self.first_step = Thinned(), step
            self.facts = pending if pending is not None else fresh_facts()
            self.start_line = self.pending_line if pending is not None else number
            return
        while self.records and self.records[-1]["step"] >= step:  # a resume redoes these steps
            self.records.pop()
        if pending is not None:
            for where in ("train", "model"):
                self.facts[where].update(pending[where])
            self.facts.update({k: v for k, v in pending.items() if k not in ("train", "model")})

    def finish(self, source: str) -> tuple[list[dict[str, Any]], str]:
        """(records, source words) once the whole log is read; warnings say what was left out."""
        for record in self.records:
            record.pop("_better", None)
        thinned = self.records.windows_text()
        records = self.records.finish()
        if self.long_numbers:
            n = len(self.long_numbers)
            log.warning("%s: skipped %d line%s whose step number is over %d digits (line %d)", self.path, n,
                        "s" if n > 1 else "", MAX_DIGITS, self.long_numbers[0])
        if thinned:
            source = f"{source} ({thinned})"
        if not self.runs_before:
            return records, source
        earlier = f"{self.runs_before} earlier run{'s' if self.runs_before > 1 else ''}"
        log.warning("%s: holds %d runs (the step counter starts again at line %d); diagnosing the last one",
                    self.path, self.runs_before + 1, self.start_line)
        return records, f"{source} (its last run, from line {self.start_line}; {earlier} left out)"
