"""Records and windows of a long history held as columns (numpy arrays), which probes.doctor.thinning
merges as its dicts would be merged, bit for bit, without a dict for each: `Rows`, records a
reader hands over in a block; `Block`, the closed windows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from probes.doctor.merging import (CODES, KIND, KIND_NAMES, NAN, NONE, OK, WEIGHT, in_order_sum, kind_of,
                                   merge)

__all__ = ["Block", "Rows", "close_mixed"]

MEANS = ("train_loss", "step_time_ms")  # what merge() averages over a window's steps
MAX_PARTS = 16  # parts kept before they are put together: memory bounded by the windows, not the pieces


class Rows:
    """Records given as columns: {"step": steps[i], name: columns[name][i], ...} for every i,
    what Thinned.extend merges without making a dict of each. `records` gives some rows as a
    dict instead, each holding a val loss (an eval: never merged; its step is steps[i])."""

    def __init__(self, steps: np.ndarray, columns: dict[str, np.ndarray],
                 records: dict[int, dict[str, Any]] | None = None):
        self.steps = np.asarray(steps, dtype=np.int64)
        self.names = tuple(columns)
        self.cols = {name: np.asarray(col, dtype=np.float64) for name, col in columns.items()}
        self.records = records or {}
        self.held = np.array(sorted(self.records), dtype=np.int64)  # the rows given as records, in order
        self.is_record = np.zeros(len(self.steps), dtype=bool)
        self.is_record[self.held] = True
        n = len(self.steps)
        if "train_loss" not in self.cols or "val_loss" in self.cols:
            self.kinds = np.full(n, NONE, dtype=np.int8)  # kind(): no train loss, or an eval: never merged
        else:
            finite = np.isfinite(self.cols["train_loss"])
            every = finite.copy()
            for col in self.cols.values():
                every &= np.isfinite(col)
            self.kinds = np.where(~finite, NAN, np.where(every, OK, NONE)).astype(np.int8)
        if self.records:
            self.kinds[list(self.records)] = NONE

    def __len__(self) -> int:
        return len(self.steps)

    def prepend(self, records: list[dict[str, Any]]) -> Rows:
        """These records (that fit()) before the rows."""
        steps = np.concatenate([[r["step"] for r in records], self.steps])
        columns = {n: np.concatenate([[r[n] for r in records], c]) for n, c in self.cols.items()}
        return Rows(steps, columns, {i + len(records): r for i, r in self.records.items()})

    def fits(self, record: dict[str, Any]) -> bool:
        """A raw record that could be one of these rows (the same keys, float values)."""
        return (len(record) == len(self.names) + 1 and type(record.get("step")) is int
                and all(type(record.get(n)) is float for n in self.names))

    def dicts(self, a: int, b: int) -> list[dict[str, Any]]:
        keys = ("step",) + self.names
        values = [self.steps[a:b].tolist()] + [self.cols[n][a:b].tolist() for n in self.names]
        out = [dict(zip(keys, v)) for v in zip(*values)]
        for i in self.held_in(a, b):
            out[i - a] = self.records[i]
        return out

    def held_in(self, a: int, b: int) -> list[int]:
        """The rows from a to b given as records."""
        lo, hi = np.searchsorted(self.held, (a, b)).tolist()
        return self.held[lo:hi].tolist()

    def values(self, i: int) -> dict[str, float]:
        """Row i's columns (not its record)."""
        return {name: float(col[i]) for name, col in self.cols.items()}

    def part(self, a: int, b: int) -> Rows:
        return Rows(self.steps[a:b], {n: c[a:b] for n, c in self.cols.items()},
                    {i - a: self.records[i] for i in self.held_in(a, b)})

    def to_block(self, block: Block, a: int, b: int) -> None:
        """Rows a..b-1 into the block as records (not windows)."""
        block.add_columns(self.steps[a:b], self.kinds[a:b], {n: c[a:b] for n, c in self.cols.items()}, 1, False,
                          {i - a: self.records[i] for i in self.held_in(a, b)})

    def kind_names(self, a: int, b: int) -> list[str | None]:
        return [KIND_NAMES[k] for k in self.kinds[a:b].tolist()]

    def merged(self, a: int, b: int, group_kind: str) -> dict[str, Any]:
        """merge() of the records a..b-1 (b - a > 1), from the columns."""
        out = self.dicts(b - 1, b)[0]
        out[KIND], out[WEIGHT] = group_kind, b - a
        if group_kind == "nan":
            out["step"] = int(self.steps[a])
            return out
        for name in ("train_loss", "step_time_ms"):
            if name in self.cols:
                out[name] = float(in_order_sum(self.cols[name][a:b])) / (b - a)
        if "grad_norm" in self.cols:
            out["grad_norm"] = max(self.cols["grad_norm"][a:b].tolist())
        return out

    def starts(self, a: int, k: int, w: int) -> np.ndarray:
        """Where the runs that the k windows of w rows from a close into start: each window's
        first row, and each record and the row after it (a record is never merged)."""
        held = self.is_record[a:a + k * w]
        starts = held.copy()
        starts[::w] = True
        starts[1:] |= held[:-1]
        return starts

    def closing(self, a: int, k: int, w: int) -> tuple[np.ndarray, dict[int, list[dict[str, Any]]]]:
        """How many entries each of the k windows of w rows from a closes into, and the dicts of
        those holding other than plain finite rows and records (NaN, inf: close_mixed)."""
        end = a + k * w
        good = ((self.kinds[a:end] == OK) | self.is_record[a:end]).reshape(k, w).all(axis=1)
        counts = self.starts(a, k, w).reshape(k, w).sum(axis=1)
        others = {j: close_mixed([], self, a + j * w, a + (j + 1) * w) for j in np.flatnonzero(~good).tolist()}
        for j, windows in others.items():
            counts[j] = len(windows)
        return counts, others

    def closed(self, a: int, k: int, w: int, others: dict[int, list[dict[str, Any]]]) -> tuple:
        """The entries the k windows of w rows from a close into, as a Block part: each run of
        plain rows merge()d in numpy (sums in merge()'s order, padded with zeros: bit for bit),
        a run of one row kept as it is, records and `others`' windows as dicts, in order."""
        starts = self.starts(a, k, w)
        bounds = np.append(np.flatnonzero(starts), k * w) + a
        first, stop = bounds[:-1], bounds[1:]
        bad = [j for j in others if j < k]
        if bad:
            good = np.ones(k, dtype=bool)
            good[bad] = False
            keep = good[(first - a) // w]
            first, stop = first[keep], stop[keep]
        length, last = stop - first, stop - 1
        span = np.arange(w)
        inside = span < length[:, None]  # [run row]
        at = np.minimum(first[:, None] + span, last[:, None])
        cols = {}
        with np.errstate(invalid="ignore", over="ignore"):
            for name, col in self.cols.items():
                if name in MEANS:
                    merged = in_order_sum(np.where(inside, col[at], 0.0)) / length
                elif name == "grad_norm":
                    merged = np.where(inside, col[at], -np.inf).max(axis=1)
                else:
                    merged = col[last]
                cols[name] = np.where(length > 1, merged, col[first])
        steps, kinds = np.where(length > 1, self.steps[last], self.steps[first]), np.full(len(first), OK, dtype=np.int8)
        extras = {i: self.records[row] for i, row in enumerate(first.tolist()) if self.is_record[row]}
        part = [steps, kinds, cols, length, length > 1, extras]
        if bad:
            part = interleave(part, first, {a + j * w: others[j] for j in bad})
        return tuple(part)


def close_mixed(records: list[dict[str, Any]], rows: Rows, a: int, b: int) -> list[dict[str, Any]]:
    """runs_of(records + the records of rows[a:b]): a run of rows alone merged from the columns."""
    kinds = [kind_of(r) for r in records] + rows.kind_names(a, b)
    out: list[dict[str, Any]] = []
    start = 0
    for i in range(1, len(kinds) + 1):
        if i < len(kinds) and kinds[i] == kinds[start] and kinds[i] is not None:
            continue
        k, lo, hi = kinds[start], start, i  # one run: items lo..hi-1
        if lo >= len(records) and hi - lo > 1:
            out.append(rows.merged(a + lo - len(records), a + hi - len(records), k))
        else:
            group = records[lo:hi] + rows.dicts(a + max(lo - len(records), 0), a + max(hi - len(records), 0))
            out.append(merge(group, k) if len(group) > 1 else group[0])
        start = i
    return out


class Block:
    """A Thinned's closed windows (and older records), oldest first, as columns: a plain entry (a
    record or window with the block's `names`: its step, weight, kind, the names' values, and
    whether it is a window, shown with _k and _n) in arrays; any other as its dict in `extras`.
    Entries come in parts, kept as given (O(1) each) and put together (`consolidate`) when the
    block is compacted or read."""

    def __init__(self) -> None:
        self.parts: list[Any] = []
        self.size = 0
        self.steps, self.weights = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        self.kinds, self.plain, self.window = np.zeros(0, dtype=np.int8), np.zeros(0, dtype=bool), np.zeros(0, dtype=bool)
        self.names: tuple[str, ...] | None = None
        self.cols: dict[str, np.ndarray] = {}
        self.extras: dict[int, dict[str, Any]] = {}

    def __len__(self) -> int:
        return self.size

    def add_dicts(self, records: list[dict[str, Any]]) -> None:
        if records:
            if self.parts and isinstance(self.parts[-1], list):
                self.parts[-1].extend(records)
            else:
                self.parts.append(list(records))
            self.size += len(records)

    def add_columns(self, steps: np.ndarray, kinds: np.ndarray, columns: dict[str, np.ndarray], weights: Any,
                    window: Any, extras: dict[int, dict[str, Any]] | None = None) -> None:
        """Plain entries (records: weight 1, not windows; or windows of `weights` steps), those in
        `extras` (by position) given as dicts instead."""
        if len(steps):
            self.parts.append((steps, kinds, columns, weights, window, extras or {}))
            self.size += len(steps)
            if len(self.parts) > MAX_PARTS:
                self.consolidate()

    def consolidate(self) -> None:
        """The parts added since into the arrays (columns of other names than the block's as dicts)."""
        if not self.parts:
            return
        if self.names is None:
            self.names = next((tuple(p[2]) for p in self.parts if isinstance(p, tuple)), None)
        at = len(self.steps)
        steps, weights, kinds, plain, window = [self.steps], [self.weights], [self.kinds], [self.plain], [self.window]
        cols = {name: [col] for name, col in self.cols.items()} if self.names is not None else {}
        for name in self.names or ():
            cols.setdefault(name, [np.full(at, np.nan)])
        for part in self.parts:
            if isinstance(part, tuple) and tuple(part[2]) != self.names:
                part = plain_dicts(part)
            if isinstance(part, list):
                n = len(part)
                part = (np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int8),
                        {name: np.full(n, np.nan) for name in self.names or ()}, 1, False, dict(enumerate(part)))
            part_steps, part_kinds, columns, part_weights, is_window, extras = part
            n = len(part_steps)
            part_kinds, part_weights = np.array(part_kinds, dtype=np.int8), np.array(np.broadcast_to(part_weights, n), dtype=np.int64)
            part_plain, part_window = np.ones(n, dtype=bool), np.array(np.broadcast_to(is_window, n), dtype=bool)
            for i, record in extras.items():
                self.extras[at + i] = record
                part_kinds[i], part_weights[i] = CODES[kind_of(record)], record.get(WEIGHT, 1)
                part_plain[i] = part_window[i] = False
            steps.append(np.asarray(part_steps, dtype=np.int64))
            kinds.append(part_kinds)
            weights.append(part_weights)
            plain.append(part_plain)
            window.append(part_window)
            for name in self.names or ():
                cols[name].append(np.asarray(columns[name], dtype=np.float64))
            at += n
        self.parts = []
        self.steps, self.weights, self.kinds = np.concatenate(steps), np.concatenate(weights), np.concatenate(kinds)
        self.plain, self.window = np.concatenate(plain), np.concatenate(window)
        self.cols = {name: np.concatenate(parts) for name, parts in cols.items()}

    def dicts(self, a: int = 0, b: int | None = None) -> list[dict[str, Any]]:
        """Entries a..b-1 as the dicts Thinned would hold."""
        self.consolidate()
        b = self.size if b is None else b
        names = self.names or ()
        keys = ("step",) + names
        values = zip(self.steps[a:b].tolist(), *(self.cols[n][a:b].tolist() for n in names))
        out = [dict(zip(keys, v)) for v in values]
        for i, (w, k, is_window) in enumerate(zip(self.weights[a:b].tolist(), self.kinds[a:b].tolist(),
                                                   self.window[a:b].tolist())):
            if is_window:
                out[i][KIND], out[i][WEIGHT] = KIND_NAMES[k], w
        held = range(a, b) if b - a < len(self.extras) else self.extras
        for i in held:
            if a <= i < b and i in self.extras:
                out[i - a] = self.extras[i]
        return out

    def entry(self, i: int) -> dict[str, Any]:
        """Entry i as its dict (consolidated)."""
        if i in self.extras:
            return self.extras[i]
        record = {"step": int(self.steps[i]), **{n: float(self.cols[n][i]) for n in self.names or ()}}
        if self.window[i]:
            record[KIND], record[WEIGHT] = KIND_NAMES[self.kinds[i]], int(self.weights[i])
        return record

    def clear(self) -> None:
        self.__init__()  # type: ignore[misc]

    def compact(self) -> int:
        """Neighbouring entries of one mergeable kind merged pairwise, as Thinned.compact pairs
        them (in each run of one kind, the first two, the next two, ...); how many merged away."""
        self.consolidate()
        m = self.size
        if m < 2:
            return 0
        codes, at = self.kinds, np.arange(m)
        boundary = np.ones(m, dtype=bool)  # where a run of one mergeable kind starts
        boundary[1:] = (codes[1:] != codes[:-1]) | (codes[1:] == NONE)
        run_start = np.maximum.accumulate(np.where(boundary, at, 0))
        first = ((at - run_start) % 2 == 0) & (codes != NONE)
        first[:-1] &= ~boundary[1:]
        first[-1] = False
        second = np.zeros(m, dtype=bool)
        second[1:] = first[:-1]
        starts = np.flatnonzero(~second)  # each new entry's first old one
        paired, nxt = first[starts], np.minimum(starts + 1, m - 1)
        both = paired & self.plain[starts] & self.plain[nxt]
        ok = both & (codes[starts] == OK)
        wa, wb = self.weights[starts], self.weights[nxt]
        extras = {}
        for j in np.flatnonzero(paired & ~both).tolist():  # a pair with a dict in it: merge()d
            a = int(starts[j])
            extras[j] = merge([self.entry(a), self.entry(a + 1)], KIND_NAMES[codes[a]])
        new_of = np.cumsum(~second) - 1
        for i, record in self.extras.items():
            if not paired[new_of[i]]:
                extras[int(new_of[i])] = record
        cols = {}
        with np.errstate(invalid="ignore", over="ignore"):  # (values of dict entries are NaN)
            for name, col in self.cols.items():
                a, b = col[starts], col[nxt]
                if name in MEANS:
                    merged = (0.0 + a * wa + b * wb) / (wa + wb)  # merge()'s order
                elif name == "grad_norm":
                    merged = np.where(b > a, b, a)
                else:
                    merged = b
                cols[name] = np.where(ok, merged, np.where(both, b, a))  # a NaN pair keeps the last's values
        self.steps = np.where(ok, self.steps[nxt], self.steps[starts])  # a NaN pair: its first step
        self.weights = np.where(paired, wa + wb, wa)
        self.kinds, self.window = codes[starts], self.window[starts] | paired
        self.plain = np.where(paired, both, self.plain[starts])
        self.cols, self.extras, self.size = cols, extras, len(starts)
        return m - len(starts)


def interleave(part: list, rows: np.ndarray, windows: dict[int, list[dict[str, Any]]]) -> list:
    """A part's entries (each starting at rows[i]) and other windows' dicts (those starting at
    each key) in row order."""
    steps, kinds, cols, weights, window, extras = part
    n, added = len(steps), sum(len(w) for w in windows.values())
    where = np.concatenate([rows, np.array([r for r, ws in windows.items() for _ in ws], dtype=np.int64)])
    sub = np.concatenate([np.zeros(n, dtype=np.int64), np.array([t for ws in windows.values() for t in range(len(ws))],
                                                                  dtype=np.int64)])
    order = np.lexsort((sub, where))
    position = np.empty_like(order)
    position[order] = np.arange(len(order))
    pad = lambda values, fill: np.concatenate([values, np.full(added, fill, dtype=np.asarray(values).dtype)])[order]  # noqa: E731
    out_extras = {int(position[i]): r for i, r in extras.items()}
    for i, r in enumerate(r for ws in windows.values() for r in ws):
        out_extras[int(position[n + i])] = r
    return [pad(steps, 0), pad(kinds, OK), {name: pad(c, np.nan) for name, c in cols.items()}, pad(weights, 1),
            pad(window, False), out_extras]


def plain_dicts(part: tuple) -> list[dict[str, Any]]:
    """A part of entries as dicts."""
    steps, kinds, columns, weights, window, extras = part
    n = len(steps)
    keys = ("step",) + tuple(columns)
    values = zip(np.asarray(steps).tolist(), *(np.asarray(c).tolist() for c in columns.values()))
    out = [dict(zip(keys, v)) for v in values]
    flags = zip(np.asarray(kinds).tolist(), np.broadcast_to(weights, n).tolist(), np.broadcast_to(window, n).tolist())
    for r, (k, w, is_window) in zip(out, flags):
        if is_window:
            r[KIND], r[WEIGHT] = KIND_NAMES[k], w
    for i, record in extras.items():
        out[i] = record
    return out
