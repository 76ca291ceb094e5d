"""What a window of a long history is (probes.doctor.thinning): which records may merge (`kind`), and
one window from neighbouring ones (`merge`), the same from dicts here and from columns in
probes.doctor.thin_columns."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["CODES", "KIND", "KIND_NAMES", "NAN", "NONE", "OK", "WEIGHT", "in_order_sum", "kind", "kind_of",
           "merge", "runs_of"]

WEIGHT, KIND = "_n", "_k"  # steps a window stands for, and its kind; removed by finish()
OK, NAN, NONE = 0, 1, 2  # kind() as the columns hold it
KIND_NAMES = ("ok", "nan", None)
CODES = {"ok": OK, "nan": NAN, None: NONE}


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


def in_order_sum(values: np.ndarray) -> np.ndarray:
    """Sums along the last axis added one after the other from 0.0, as merge() adds (numpy's sum
    adds pairwise, which rounds differently): a running sum's last value."""
    with np.errstate(invalid="ignore", over="ignore"):  # (windows with inf are merged elsewhere)
        return np.cumsum(values, axis=-1)[..., -1] + 0.0  # + 0.0: merge() starts at 0.0 (-0.0 + 0.0 is 0.0)
