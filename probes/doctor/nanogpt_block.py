"""nanoGPT's step lines read a piece of the log at a time, in numpy: a 2,000,000-line log is two
million of them, and any Python work per line costs more than the file's whole reading.

A piece's lines are grouped by their first byte and length; within a group, consecutive lines
whose digits sit in the same places share one template (the line with every digit 0), matched
once against ITER_LINE or EVAL_LINE (read_nanogpt's ITER and EVAL, whole-line: a template
matches exactly when its lines do: its patterns treat every digit alike) and read by
column: a decimal field of up to 15 digits as an integer over a power of ten, which rounds as
float() does; `nan`, `inf` and exponents by float(). Only lines that are exactly an iter or an
eval line (a trailing CR allowed) are read so: any other line, a prefixed or indented one
included, goes to read_nanogpt.read_line as it always did. An eval line followed by the iter line
of its step (as nanoGPT prints them) is one record; PrintedRuns.steps_read takes the rest.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np

from probes.doctor.printed_runs import NUMBER, PrintedRuns
from probes.doctor.text_log import TextLog
from probes.doctor.thin_columns import Rows

__all__ = ["read_piece"]

# a line read here: exactly one of these (the digits of a step at most 15: an int64, read exactly)
ITER_LINE = re.compile(rf"iter (\d{{1,15}}): loss {NUMBER}, time {NUMBER}ms, mfu {NUMBER}%\r?")
EVAL_LINE = re.compile(rf"step (\d{{1,15}}): train loss {NUMBER}, val loss {NUMBER}\r?")
DECIMAL = re.compile(r"0+(?:\.0*)?")  # a field read as digits over a power of ten
MAX_DIGITS = 15  # below 2**53: the integer and its quotient by a power of ten are exact
LONGEST = 256  # bytes; a longer line is left to read_line
ITER, EVAL = 1, 2
TEMPLATES: dict[bytes, tuple | None] = {}  # template -> (kind, field spans) or None


def template(line: bytes) -> tuple | None:
    """(ITER or EVAL, the spans of its step and two values) for a template that is exactly one
    of those lines; None for any other (read by read_line)."""
    if line not in TEMPLATES:
        if len(TEMPLATES) > 4096:
            TEMPLATES.clear()
        text = line.decode("ascii", "replace")
        found = None
        for kind, pattern in ((ITER, ITER_LINE), (EVAL, EVAL_LINE)):
            if text.isascii() and (match := pattern.fullmatch(text)):
                found = (kind, match.span(1), match.span(2), match.span(3))
        TEMPLATES[line] = found
    return TEMPLATES[line]


def fields(lines: np.ndarray, shape: str, spans: tuple[tuple[int, int], ...]) -> list[np.ndarray]:
    """The numbers at each span of columns of each line ([lines, bytes]), as float() reads them:
    decimal ones in one product (each digit's code times its place value, less 48 times the sum
    of them: integers below 2**53 all the way, so exact in any order), others by float()."""
    out: list[np.ndarray | None] = []
    columns, places = [], []
    for start, end in spans:
        digits = [i for i in range(start, end) if shape[i] == "0"]
        if DECIMAL.fullmatch(shape, start, end) and len(digits) <= MAX_DIGITS:
            column = np.zeros((len(shape), 1))
            column[digits, 0] = 10.0 ** np.arange(len(digits) - 1, -1, -1)
            dot = shape.find(".", start, end)
            columns.append(column)
            places.append(end - dot - 1 if dot >= 0 else 0)
            out.append(None)
        else:
            text = np.ascontiguousarray(lines[:, start:end]).view(f"S{end - start}").ravel()
            out.append(np.array([float(x) for x in text.tolist()]))
    if columns:
        weights = np.hstack(columns)  # [byte field]
        used = np.flatnonzero(weights.any(axis=1))
        wholes = lines[:, used].astype(np.float64) @ weights[used] - 48.0 * weights.sum(axis=0)
        decimal = iter(range(len(columns)))
        for i, value in enumerate(out):
            if value is None:
                j = next(decimal)
                out[i] = wholes[:, j] / 10.0 ** places[j] if places[j] else wholes[:, j]
    return out  # type: ignore[return-value]


def classify(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, ...]:
    """Each line's kind (ITER, EVAL, 0: read by read_line), step and two values."""
    n = len(starts)
    kinds, steps = np.zeros(n, dtype=np.int8), np.zeros(n, dtype=np.int64)
    first, second = np.zeros(n), np.zeros(n)
    lead = data[starts]
    group = np.where((lengths > 0) & (lengths <= LONGEST) & ((lead == ord("i")) | (lead == ord("s"))),
                     lengths * 2 + (lead == ord("s")), 0)
    keys = np.flatnonzero(np.bincount(group)) if n else group
    for key in keys[keys > 0].tolist():
        rows = np.flatnonzero(group == key)
        width = key // 2
        lines = np.lib.stride_tricks.sliding_window_view(data, width)[starts[rows]]  # [line byte]
        shapes = np.where(lines - np.uint8(49) < 9, np.uint8(48), lines)  # digits 1-9 as 0
        same = shapes.view(np.dtype((np.void, width))).ravel()
        cuts = [0] + (np.flatnonzero(same[1:] != same[:-1]) + 1).tolist() + [len(rows)]
        for a, b in zip(cuts[:-1], cuts[1:]):
            found = template(shapes[a].tobytes())
            if found is None:
                continue
            kind, *spans = found
            at = rows[a:b]
            step, x, y = fields(lines[a:b], shapes[a].tobytes().decode("ascii"), tuple(spans))
            kinds[at], steps[at], first[at], second[at] = kind, step.astype(np.int64), x, y
    return kinds, steps, first, second


def read_piece(number: int, piece: str, runs: PrintedRuns, text: TextLog,
               read_line: Callable[[int, str, PrintedRuns], None]) -> None:
    """A piece of whole lines from line `number` into `runs`, as read_line would take each."""
    data = np.frombuffer(piece.encode("utf-8", "surrogatepass"), dtype=np.uint8)
    ends = np.flatnonzero(data == ord("\n"))
    starts = np.concatenate(([0], ends[:-1] + 1))
    kinds, steps, first, second = classify(data, starts, ends - starts)
    # an eval line just before the iter line of its step: one record (read_line reads it so)
    evals = np.flatnonzero(kinds == EVAL)
    kinds[evals] = 0  # read by read_line, but those paired
    evals = evals[evals + 1 < len(kinds)]
    paired = evals[(kinds[evals + 1] == ITER) & (steps[evals + 1] == steps[evals])]
    kinds[paired] = EVAL
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
