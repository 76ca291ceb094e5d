"""nanoGPT's step lines read a piece of the log at a time, in numpy (probes.doctor.line_block): only
lines that are exactly ITER_LINE or EVAL_LINE (read_nanogpt's ITER and EVAL, whole-line, a
trailing CR allowed) are read so: any other line, a prefixed or indented one included, goes to
read_nanogpt.read_line as it always did. An eval line followed by the iter line
of its step (as nanoGPT prints them) is one record; PrintedRuns.steps_read takes the rest.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np

from probes.doctor.line_block import Shapes, classify, line_ends
from probes.doctor.printed_runs import NUMBER, PrintedRuns
from probes.doctor.text_log import TextLog
from probes.doctor.thin_columns import Rows

__all__ = ["read_piece"]

# a line read here: exactly one of these (the digits of a step at most 15: an int64, read exactly)
ITER_LINE = re.compile(rf"iter (\d{{1,15}}): loss {NUMBER}, time {NUMBER}ms, mfu {NUMBER}%\r?")
EVAL_LINE = re.compile(rf"step (\d{{1,15}}): train loss {NUMBER}, val loss {NUMBER}\r?")
ITER, EVAL = 1, 2
SHAPES = Shapes({ITER: (ITER_LINE, (1, 2, 3)), EVAL: (EVAL_LINE, (1, 2, 3))}, b"is")


def read_piece(number: int, piece: str, runs: PrintedRuns, text: TextLog,
               read_line: Callable[[int, str, PrintedRuns], None]) -> None:
    """A piece of whole lines from line `number` into `runs`, as read_line would take each."""
    data = np.frombuffer(piece.encode("utf-8", "surrogatepass"), dtype=np.uint8)
    starts, ends = line_ends(data)
    kinds, values = classify(data, starts, ends - starts, SHAPES)
    steps, first, second = np.nan_to_num(values[:, 0]).astype(np.int64), values[:, 1], values[:, 2]
    # an eval line just before the iter line of its step: one record (read_line reads it so)
    evals = np.flatnonzero(kinds == EVAL)
    kinds[evals] = 0  # read by read_line, but those paired
    evals = evals[evals + 1 < len(kinds)]
    paired = evals[(kinds[evals + 1] == ITER) & (steps[evals + 1] == steps[evals])]
    kinds[paired] = EVAL
    runs.lines += int(np.count_nonzero(kinds))  # (the other lines are read_line's to count)
    at = np.flatnonzero(kinds == ITER)  # the rows: iter lines, in order
    row_of = np.searchsorted(at, paired + 1)
    records: dict[int, dict[str, Any]] = {}
    better: dict[int, tuple[int, dict[str, Any]]] = {}
    for row, line, step, x, y, t in zip(row_of.tolist(), paired.tolist(), steps[paired].tolist(),
                                        first[paired].tolist(), second[paired].tolist(),
                                        second[paired + 1].tolist()):
        better[row] = (number + line, {"train_loss": x, "val_loss": y})
        records[row] = {"step": step, "train_loss": x, "val_loss": y, "_better": True, "step_time_ms": t}
    rows = Rows(steps[at], {"train_loss": first[at], "step_time_ms": second[at]}, records)
    numbers = number + at
    done = 0
    for line in np.flatnonzero(kinds == 0).tolist() + [len(kinds)]:
        upto = int(np.searchsorted(at, line))
        if upto > done:
            part = rows.part(done, upto)
            runs.steps_read(numbers[done:upto], part, {i: better[i + done] for i in part.records})
            done = upto
        if line < len(kinds):
            raw = data[starts[line]:ends[line] + 1].tobytes().decode("utf-8", "surrogatepass")
            for n, kept in text.lines(number + line, raw):
                read_line(n, kept.strip(), runs)
