"""A long history kept in bounded memory while it is read: records in step order; once there are
more than CAP of them, neighbouring ones are merged into windows and each later one closed at the
current width (1, then 2, 4, ...), so that a 2,000,000-step log costs what a 100,000-step one
does, and the rules judge about CAP records at most (a history up to CAP is kept as it is).

What a window keeps, so that the rules answer as on the full history (tests/test_doctor_audit_load):
- the mean train loss and step time over its steps (weighted by the steps each half holds),
  the largest gradient norm (a spike is not averaged away), the last lr and token count;
- its last step (as a Trainer logging every N steps logs the mean at the window's end).
Never merged: a record with a val loss (evals are few and each is a point of the val curve), one
with a non-finite gradient norm and a finite loss (a skipped fp16 step, counted by the rules), the
first record, and the latest one (a reader may still add to its step). Records whose loss is
non-finite merge only with each other, keeping the first one's step: the divergence is dated
exactly. `thinned` counts the records merged away, for the reader to say.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["CAP", "Rows", "Thinned", "kind", "merge"]

CAP = 20_000  # windows held before neighbouring ones are merged and the window doubles
WEIGHT, KIND = "_n", "_k"  # steps a window stands for, and its kind; removed by finish()
OK, NAN, NONE = 0, 1, 2  # kind() of a row, as Rows holds it
KIND_NAMES = ("ok", "nan", None)


def kind(record: dict[str, Any]) -> str | None:
    """'ok' or 'nan' (which records may merge with which), None for one never merged."""
    if "val_loss" in record:
        return None
    loss = record.get("train_loss")
    if not isinstance(loss, float):
        return None
    if not math.isfinite(loss):
        return "nan"
    return "ok" if all(map(math.isfinite, record.values())) else None


def merge(group: list[dict[str, Any]], group_kind: str) -> dict[str, Any]:
    """One window from neighbouring records (or windows) of one kind, `group_kind` (the caller
    has it: not told again here), in one pass: the hot path."""
    first, last = group[0], group[-1]
    out = {**first, **last}
    out[KIND] = group_kind
    if group_kind == "nan":
        out[WEIGHT] = sum(r.get(WEIGHT, 1) for r in group)
        out["step"] = first["step"]
        return out
    total, loss, time, norm = 0, 0.0, 0.0, -math.inf
    has_time = has_norm = True
    for r in group:
        n = r.get(WEIGHT, 1)
        total += n
        loss += r["train_loss"] * n
        if has_time:
            t = r.get("step_time_ms")
            if t is None:
                has_time = False
            else:
                time += t * n
        if has_norm:
            g = r.get("grad_norm")
            if g is None:
                has_norm = False
            elif g > norm:
                norm = g
    out[WEIGHT] = total
    out["train_loss"] = loss / total
    if has_time:
        out["step_time_ms"] = time / total
    if has_norm:
        out["grad_norm"] = norm
    return out


def kind_of(record: dict[str, Any]) -> str | None:
    return record[KIND] if WEIGHT in record else kind(record)


def runs_of(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Maximal runs of one mergeable kind merged; records of no kind kept as they are."""
    kinds = [r[KIND] if WEIGHT in r else kind(r) for r in records]
    if kinds[0] == "ok" and kinds.count("ok") == len(kinds):  # the usual window: one merge
        return [merge(records, "ok")]
    out, group, group_kind = [], [], None
    for r, k in zip(records, kinds):
        if group and k == group_kind and k is not None:
            group.append(r)
            continue
        if group:
            out.append(merge(group, group_kind) if len(group) > 1 else group[0])
        group, group_kind = [r], k
    if group:
        out.append(merge(group, group_kind) if len(group) > 1 else group[0])
    return out


class Thinned(list):
    """Records in step order: windows of up to `width` steps, then the latest records as read
    (`self[-1]` is always the last record read, which a reader may still update). When the
    windows pass `cap`, neighbouring ones merge and the width doubles."""

    def __init__(self, cap: int | None = None):
        super().__init__()
        self.cap, self.width, self.raw, self.thinned = cap or CAP, 1, 0, 0  # raw: latest records not in a window

    def append(self, record: dict[str, Any]) -> None:  # type: ignore[override]
        super().append(record)
        if self.width == 1:  # no windows yet: every record is its own
            self.raw = 1
            if len(self) > self.cap:
                self.compact()
            return
        self.raw += 1
        if self.raw > self.width:
            self.close_window()

    def pop(self, index: int = -1) -> dict[str, Any]:  # type: ignore[override]
        self.raw = max(self.raw - 1, 0)
        return super().pop(index)

    def close_window(self) -> None:
        """The oldest `width` of the latest records (never the last) merged into windows."""
        start = len(self) - self.raw
        windows = runs_of(self[start:start + self.width])
        self.thinned += self.width - len(windows)
        self[start:start + self.width] = windows
        self.raw -= self.width
        if len(self) - self.raw > self.cap:
            self.compact()

    def compact(self) -> None:
        """Neighbouring windows (all but the first record and the latest) merged pairwise; the
        window width doubles, so this happens log2(steps / cap) times in all."""
        end = len(self) - self.raw
        out, i = [self[0]], 1
        while i < end:
            a = self[i]
            if i + 1 < end and (k := kind_of(a)) is not None and kind_of(self[i + 1]) == k:
                out.append(merge([a, self[i + 1]], k))
                i += 2
            else:
                out.append(a)
                i += 1
        self.thinned += end - len(out)
        self[:end] = out
        self.width *= 2
        if len(out) > self.cap // 2:  # mostly evals, which never merge: let it grow instead of
            self.cap = 2 * len(out)  # compacting again at every append (quadratic)
        if self.raw > self.width:
            self.close_window()

    def extend(self, rows: Rows) -> None:  # type: ignore[override]
        """The rows appended in order, into the same windows, bit for bit, as append() of each
        gives, without a dict for each: windows of plain finite records are merged in numpy (the
        hot path of a long log), the others as append() merges them."""
        p = 0
        while p < len(rows):
            rows, p = self.take_raw(rows, p)
            if self.width == 1:  # no windows yet: every record is its own, up to the first compaction
                take = min(len(rows) - p, self.cap + 1 - len(self))
                list.extend(self, rows.dicts(p, p + take))
                p, self.raw = p + take, 1
                if len(self) > self.cap:
                    self.compact()
                continue
            p = self.first_window(rows, p)
            if p < len(rows):
                p = self.close_windows(rows, p)

    def take_raw(self, rows: Rows, p: int) -> tuple[Rows, int]:
        """The latest records that could be rows (the same keys) taken back, in front of rows[p:]."""
        taken = 0
        while taken < self.raw and rows.fits(self[-1 - taken]):
            taken += 1
        if not taken:
            return rows, p
        records = self[len(self) - taken:]
        del self[len(self) - taken:]
        self.raw -= taken
        return rows.part(p, len(rows)).prepend(records), 0

    def first_window(self, rows: Rows, p: int) -> int:
        """The window of the latest records still raw and the rows after them, closed if rows
        fill it (the row after it read); the next row to place."""
        if not self.raw:
            return p
        n, need = len(rows), self.width - self.raw
        if n - p <= need:  # the window stays open: the rows are its latest records
            list.extend(self, rows.dicts(p, n))
            self.raw += n - p
            return n
        records = self[len(self) - self.raw:]
        del self[len(self) - self.raw:]
        windows = close_mixed(records, rows, p, p + need)
        list.extend(self, windows)
        self.thinned += self.width - len(windows)
        self.raw = 0  # rows[p + need] is the latest record now, held in rows
        if len(self) > self.cap:
            self.compact()
        return p + need

    def close_windows(self, rows: Rows, p: int) -> int:
        """Windows of rows from p (no record raw before them) closed as each is followed by a row,
        compacting as append() does; the rows left are the latest records. Returns len(rows)."""
        n = len(rows)
        while (k := (n - p - 1) // self.width) > 0:
            w = self.width
            plain = (rows.kinds[p:p + k * w].reshape(k, w) == OK).all(axis=1)
            others = {j: close_mixed([], rows, p + j * w, p + (j + 1) * w) for j in np.flatnonzero(~plain).tolist()}
            counts = np.ones(k, dtype=np.int64)
            for j, windows in others.items():
                counts[j] = len(windows)
            # the window that takes the windows past the cap is the last before a compaction
            k = min(k, int(np.searchsorted(np.cumsum(counts), self.cap - len(self), side="right")) + 1)
            merged = rows.windows(p, k, w)
            if others:
                merged = [x for j in range(k) for x in (others[j] if j in others else (merged[j],))]
            list.extend(self, merged)
            self.thinned += k * w - len(merged)
            p += k * w
            if len(self) > self.cap:
                self.compact()
        list.extend(self, rows.dicts(p, n))
        self.raw = n - p
        return n

    def finish(self) -> list[dict[str, Any]]:
        """The records as a plain list, without the windows' bookkeeping."""
        for record in self:
            record.pop(WEIGHT, None)
            record.pop(KIND, None)
        return list(self)

    def windows_text(self) -> str:
        """'2,000,000 steps read, judged as 62,345 records (older steps in windows: mean loss,
        largest gradient norm; every eval and non-finite loss kept)', or '' when none was merged."""
        if not self.thinned:
            return ""
        return (f"{len(self) + self.thinned:,} steps read, judged as {len(self):,} records (steps in windows of "
                f"up to {self.width}: mean loss, largest gradient norm; every eval and non-finite loss kept)")


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

    def windows(self, a: int, k: int, w: int) -> list[dict[str, Any]]:
        """merge() of each of the k windows of w plain finite records from row a, in numpy: sums
        run in merge()'s order (cumsum, not numpy's pairwise sum), so the means are bit for bit."""
        end = a + k * w
        last = np.arange(a + w - 1, end, w)
        out: dict[str, list] = {"step": self.steps[last].tolist()}
        for name, col in self.cols.items():
            if name in ("train_loss", "step_time_ms"):
                out[name] = (in_order_sum(col[a:end].reshape(k, w)) / w).tolist()
            elif name == "grad_norm":
                out[name] = col[a:end].reshape(k, w).max(axis=1).tolist()
            else:
                out[name] = col[last].tolist()
        keys = tuple(out)
        return [{**dict(zip(keys, v)), KIND: "ok", WEIGHT: w} for v in zip(*out.values())]


def in_order_sum(values: np.ndarray) -> np.ndarray:
    """Sums along the last axis added one after the other from 0.0, as merge() adds (numpy's sum
    adds pairwise, which rounds differently): a running sum's last value."""
    with np.errstate(invalid="ignore", over="ignore"):  # (windows with inf are merged elsewhere)
        return np.cumsum(values, axis=-1)[..., -1] + 0.0  # + 0.0: merge() starts at 0.0 (-0.0 + 0.0 is 0.0)


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
