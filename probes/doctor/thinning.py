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

__all__ = ["CAP", "Thinned", "kind", "merge"]

CAP = 20_000  # windows held before neighbouring ones are merged and the window doubles
WEIGHT, KIND = "_n", "_k"  # steps a window stands for, and its kind; removed by finish()


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
