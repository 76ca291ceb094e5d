"""A printed log's step lines read a piece at a time in numpy: a 2,000,000-line log is two million
of them, and any Python work per line costs more than the file's whole reading. Shared by the
nanoGPT and llm.c readers (probes.doctor.nanogpt_block, probes.doctor.read_llmc).

A piece's lines are grouped by their first byte and length; within a group, consecutive lines
whose digits and signs sit in the same places share one template (the line with every digit 0 and
every '-' a '+': llm.c's z-scores change sign from line to line), matched once against the
reader's whole-line patterns (a template matches exactly when its lines do: the patterns treat
every digit alike, and '+' and '-' alike, as `[-+]`) and read by column: a decimal field of up to
15 digits as an integer over a power of ten, and `1.50e-04` as its mantissa over (or times) a
power of ten (the exponent's sign read from each line), each one correctly rounded division or
product of exact numbers, so the same float as float() gives; `nan`, `inf`, signed and longer
fields by float(). Lines that match no pattern are the reader's to read one at a time, as it
always did.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

__all__ = ["LONGEST", "Shapes", "classify", "line_ends"]

DECIMAL = re.compile(r"0+(?:\.0*)?")  # a field read as digits over a power of ten
EXPONENT = re.compile(r"(0+(?:\.0*)?)e([-+]?)(0{1,2})")  # C's %e: mantissa and exponent read as decimals
MAX_DIGITS = 15  # below 2**53: the integer and its quotient by a power of ten are exact
POW10 = np.array([float(10**i) for i in range(23)])  # 10**22 is the largest power of ten a double holds exactly
LONGEST = 256  # bytes; a longer line is left to the reader's own reading
TEMPLATE = np.arange(256, dtype=np.uint8)  # a byte's place in a template: every digit 0, every sign +
TEMPLATE[ord("1"):ord("9") + 1] = ord("0")
TEMPLATE[ord("-")] = ord("+")


@dataclass
class Shapes:
    """A reader's step lines: kind (1, 2, ...) -> (whole-line pattern, the groups it reads), and
    the first bytes such lines start with. `template` caches what each template is."""

    patterns: dict[int, tuple[re.Pattern, tuple[int, ...]]]
    leads: bytes
    cache: dict[bytes, tuple | None] = field(default_factory=dict)

    @property
    def width(self) -> int:
        return max(len(groups) for _, groups in self.patterns.values())

    def template(self, line: bytes) -> tuple | None:
        """(kind, the spans of the groups it reads) for a template that is exactly one of the
        patterns' lines; None for any other."""
        if line not in self.cache:
            if len(self.cache) > 4096:
                self.cache.clear()
            text = line.decode("ascii", "replace")
            found = None
            for kind, (pattern, groups) in self.patterns.items():
                if text.isascii() and (match := pattern.fullmatch(text)):
                    found = (kind, *(match.span(g) for g in groups))
                    break
            self.cache[line] = found
        return self.cache[line]


def fields(lines: np.ndarray, shape: str, spans: tuple[tuple[int, int], ...]) -> list[np.ndarray]:
    """The numbers at each span of columns of each line ([lines, bytes]), as float() reads them:
    decimal ones in one product (each digit's code times its place value, less 48 times the sum
    of them: integers below 2**53 all the way, so exact in any order), exponents from two such,
    others by float()."""
    out: list[np.ndarray | None] = []
    columns, places = [], []  # decimal columns: place values, and digits after the point
    powers: list[tuple[int, int, int, int]] = []  # (a decimal's column, -1, 0, 0), or an exponent's: (its
    # mantissa's column, its exponent's, the mantissa's digits after the point, where its sign is or -1)

    def column(start: int, end: int) -> int:
        digits = [i for i in range(start, end) if shape[i] == "0"]
        weights = np.zeros((len(shape), 1))
        weights[digits, 0] = 10.0 ** np.arange(len(digits) - 1, -1, -1)
        dot = shape.find(".", start, end)
        columns.append(weights)
        places.append(end - dot - 1 if dot >= 0 else 0)
        return len(columns) - 1

    for start, end in spans:
        digits = shape.count("0", start, end)
        exponent = EXPONENT.fullmatch(shape, start, end)
        if DECIMAL.fullmatch(shape, start, end) and digits <= MAX_DIGITS:
            out.append(None)
            powers.append((column(start, end), -1, 0, 0))
        elif exponent and digits <= MAX_DIGITS:
            out.append(None)
            mantissa = column(*exponent.span(1))
            places[mantissa], dot = 0, shape.find(".", *exponent.span(1))
            powers.append((mantissa, column(*exponent.span(3)),
                           exponent.end(1) - dot - 1 if dot >= 0 else 0, exponent.start(2) if exponent[2] else -1))
        else:
            text = np.ascontiguousarray(lines[:, start:end]).view(f"S{end - start}").ravel()
            out.append(np.array([float(x) for x in text.tolist()]))
    if columns:
        weights = np.hstack(columns)  # [byte field]
        used = np.flatnonzero(weights.any(axis=1))
        wholes = lines[:, used].astype(np.float64) @ weights[used] - 48.0 * weights.sum(axis=0)
        found = iter(powers)
        for i, value in enumerate(out):
            if value is None:
                at, power, point, sign = next(found)
                if power < 0:  # an integer over an exact power of ten: one correctly rounded division
                    out[i] = wholes[:, at] / POW10[places[at]] if places[at] else wholes[:, at]
                    continue
                exponent = wholes[:, power].astype(np.int64)  # its sign each line's own (the template has '+')
                out[i] = scaled(wholes[:, at], point - np.where(lines[:, sign] == ord("-"), -exponent, exponent)
                                if sign >= 0 else point - exponent)
    return out  # type: ignore[return-value]


def scaled(whole: np.ndarray, shift) -> np.ndarray:
    """whole / 10**shift (shift > 0) or whole * 10**-shift, one correctly rounded operation on
    exact numbers; a shift past 22 (no exact power of ten) by float() of the same text."""
    shift = np.broadcast_to(np.asarray(shift, dtype=np.int64), whole.shape)
    if np.abs(shift).max(initial=0) > 22:
        return np.array([float(f"{int(w)}e{-int(s)}") for w, s in zip(whole.tolist(), shift.tolist())])
    return np.where(shift >= 0, whole / POW10[np.maximum(shift, 0)], whole * POW10[np.maximum(-shift, 0)])


def line_ends(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of each line of a piece of whole lines (`end`: its line break)."""
    ends = np.flatnonzero(data == ord("\n"))
    return np.concatenate(([0], ends[:-1] + 1)).astype(np.int64), ends


def classify(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
             shapes: Shapes) -> tuple[np.ndarray, np.ndarray]:
    """Each line's kind (0: not read here) and the values of the groups its pattern reads
    ([line field], NaN past them)."""
    n = len(starts)
    kinds, values = np.zeros(n, dtype=np.int8), np.full((n, shapes.width), np.nan)
    lead_of = np.zeros(256, dtype=np.int64)
    lead_of[list(shapes.leads)] = np.arange(1, len(shapes.leads) + 1)
    lead = lead_of[data[starts]] if n else np.zeros(0, dtype=np.int64)
    group = np.where((lengths > 0) & (lengths <= LONGEST) & (lead > 0), lengths * (len(shapes.leads) + 1) + lead, 0)
    keys = np.flatnonzero(np.bincount(group)) if n else group
    for key in keys[keys > 0].tolist():
        rows = np.flatnonzero(group == key)
        width = key // (len(shapes.leads) + 1)
        lines = np.lib.stride_tricks.sliding_window_view(data, width)[starts[rows]]  # [line byte]
        templates = np.take(TEMPLATE, lines)  # digits as 0, "-" as "+"
        same = templates.view(np.dtype((np.void, width))).ravel()
        cuts = [0] + (np.flatnonzero(same[1:] != same[:-1]) + 1).tolist() + [len(rows)]
        for a, b in zip(cuts[:-1], cuts[1:]):
            found = shapes.template(templates[a].tobytes())
            if found is None:
                continue
            kind, *spans = found
            at = rows[a:b]
            kinds[at] = kind
            for j, value in enumerate(fields(lines[a:b], templates[a].tobytes().decode("ascii"), tuple(spans))):
                values[at, j] = value
    return kinds, values
