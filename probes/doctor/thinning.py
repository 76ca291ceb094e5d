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

A reader hands records over one at a time (`append`) or as columns (`extend`, probes.doctor.
thin_columns.Rows); the windows are held as columns (thin_columns.Block) and merged there in
numpy, bit for bit as the dicts would be, and made dicts once the history is read whole.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from probes.doctor.merging import KIND, OK, WEIGHT, runs_of
from probes.doctor.thin_columns import Block, Rows, close_mixed

__all__ = ["CAP", "Thinned"]

CAP = 20_000  # windows held before neighbouring ones are merged and the window doubles


class Thinned(list):
    """Records in step order: windows of up to `width` steps, then the latest records as read
    (`self[-1]` is always the last record read, which a reader may still update). When the
    windows pass `cap`, neighbouring ones merge and the width doubles. The list itself holds the
    first record and the `raw` latest ones; the windows between them wait in `block`, made dicts
    (`flush`) when the history is read whole (iterated, finished). A reader indexes it only at
    its latest record, `self[-1]`, or flushes it first."""

    def __init__(self, cap: int | None = None):
        super().__init__()
        self.cap, self.width, self.raw, self.thinned = cap or CAP, 1, 0, 0  # raw: latest records not in a window
        self.block = Block()

    def size(self) -> int:
        """Records and windows held (len() counts only those in the list, not the block's)."""
        return len(self) + self.block.size

    def __iter__(self):  # type: ignore[override]
        self.flush()
        return list.__iter__(self)

    def flush(self) -> None:
        """The block's windows made dicts, in their place in the list."""
        if self.block.size:
            at = len(self) - self.raw
            list.__setitem__(self, slice(at, at), self.block.dicts())
            self.block.clear()

    def settle(self) -> None:
        """Records the list holds between its first and its raw ones moved to the block's end
        (before anything is added there, so that the order holds)."""
        end = len(self) - self.raw
        if end > 1:
            self.block.add_dicts(list.__getitem__(self, slice(1, end)))
            list.__delitem__(self, slice(1, end))

    def windows(self) -> int:
        """Records and windows before the raw ones."""
        return self.size() - self.raw

    def append(self, record: dict[str, Any]) -> None:  # type: ignore[override]
        list.append(self, record)
        if self.width == 1:  # no windows yet: every record is its own
            self.raw = 1
            if self.block.size:
                self.settle()
            if self.size() > self.cap:
                self.compact()
            return
        self.raw += 1
        if self.raw > self.width:
            self.close_window()

    def pop(self, index: int = -1) -> dict[str, Any]:  # type: ignore[override]
        if index != -1 or not self.raw:
            self.flush()
        self.raw = max(self.raw - 1, 0)
        record = list.pop(self, index)
        if not self.raw:  # self[-1] is a window now: the block's last, made a dict in the list
            self.flush()
        return record

    def close_window(self) -> None:
        """The oldest `width` of the latest records (never the last) merged into windows."""
        start = len(self) - self.raw
        windows = runs_of(list.__getitem__(self, slice(start, start + self.width)))
        self.thinned += self.width - len(windows)
        list.__delitem__(self, slice(start, start + self.width))
        self.raw -= self.width
        self.settle()
        self.block.add_dicts(windows)
        if self.windows() > self.cap:
            self.compact()

    def compact(self) -> None:
        """Neighbouring windows (all but the first record and the latest) merged pairwise; the
        window width doubles, so this happens log2(steps / cap) times in all."""
        self.settle()
        self.thinned += self.block.compact()
        self.width *= 2
        if self.windows() > self.cap // 2:  # mostly evals, which never merge: let it grow instead of
            self.cap = 2 * self.windows()  # compacting again at every append (quadratic)
        if self.raw > self.width:
            self.close_window()

    def extend(self, rows: Rows) -> None:  # type: ignore[override]
        """The rows appended in order, into the same windows, bit for bit, as append() of each
        gives, without a dict for each: windows of plain finite records are merged in numpy (the
        hot path of a long log), the others as append() merges them."""
        p = 0
        while p < len(rows):
            rows, p = self.take_raw(rows, p)
            if self.width > 1:
                p = self.first_window(rows, p)
                if p < len(rows):
                    p = self.close_windows(rows, p)
                continue
            if not len(self):  # the first record, never merged: kept in the list
                list.append(self, rows.dicts(p, p + 1)[0])
                p, self.raw = p + 1, 1
                continue
            # no windows yet: every record is its own, up to the first compaction
            take = min(len(rows) - p, self.cap + 1 - self.size())
            self.raw = 0
            self.settle()
            rows.to_block(self.block, p, p + take - 1)
            list.append(self, rows.dicts(p + take - 1, p + take)[0])
            p, self.raw = p + take, 1
            if self.size() > self.cap:
                self.compact()

    def take_raw(self, rows: Rows, p: int) -> tuple[Rows, int]:
        """The latest records that could be rows (the same keys) taken back, in front of rows[p:]."""
        taken, size = 0, len(self)
        while taken < self.raw and taken < size - 1 and rows.fits(list.__getitem__(self, size - 1 - taken)):
            taken += 1
        if not taken:
            return rows, p
        records = list.__getitem__(self, slice(size - taken, size))
        list.__delitem__(self, slice(size - taken, size))
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
        size = len(self)
        records = list.__getitem__(self, slice(size - self.raw, size))
        list.__delitem__(self, slice(size - self.raw, size))
        windows = close_mixed(records, rows, p, p + need)
        self.raw = 0  # rows[p + need] is the latest record now, held in rows
        self.settle()
        self.block.add_dicts(windows)
        self.thinned += self.width - len(windows)
        if self.windows() > self.cap:
            self.compact()
        return p + need

    def close_windows(self, rows: Rows, p: int) -> int:
        """Windows of rows from p (no record raw before them) closed as each is followed by a row,
        compacting as append() does; the rows left are the latest records. Returns len(rows)."""
        n = len(rows)
        while (k := (n - p - 1) // self.width) > 0:
            w = self.width
            counts, others = rows.closing(p, k, w)
            # the window that takes the windows past the cap is the last before a compaction
            k = min(k, int(np.searchsorted(np.cumsum(counts), self.cap - self.windows(), side="right")) + 1)
            self.settle()
            self.block.add_columns(*rows.closed(p, k, w, others))
            self.thinned += int(k * w - counts[:k].sum())
            p += k * w
            if self.windows() > self.cap:
                self.compact()
        list.extend(self, rows.dicts(p, n))
        self.raw = n - p
        return n

    def finish(self) -> list[dict[str, Any]]:
        """The records as a plain list, without the windows' bookkeeping."""
        self.flush()
        for record in list.__iter__(self):
            record.pop(WEIGHT, None)
            record.pop(KIND, None)
        return list(list.__iter__(self))

    def windows_text(self) -> str:
        """'2,000,000 steps read, judged as 62,345 records (older steps in windows: mean loss,
        largest gradient norm; every eval and non-finite loss kept)', or '' when none was merged."""
        if not self.thinned:
            return ""
        return (f"{self.size() + self.thinned:,} steps read, judged as {self.size():,} records (steps in windows of "
                f"up to {self.width}: mean loss, largest gradient norm; every eval and non-finite loss kept)")
