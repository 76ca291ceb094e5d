"""Phase changes of a run's development (`probes.development`): when a head's type score rises or falls
sharply between snapshots, which heads change together, and what the loss did meanwhile. Torch-free.

A head's series x_0..x_{S-1} (one value per snapshot) changes sharply where, over a window of
`k = max(1, round(window * (S - 1)))` consecutive snapshot intervals, it moves by at least `sharp`
times its range over the run (max - min), and that range is at least `min_range` (a head whose
score wanders by 0.02 has no phase). The window is the steepest one (largest x[i+k] - x[i] for a
rise, smallest for a fall); the change's step is where the score crosses half of the move, read
between the two snapshots that bracket the crossing (linearly: a score that crosses half-way between
snapshots 700 and 800 at a quarter of its step there changed at 725, not at 800; Olsson et al. 2022
read the induction bump the same way, where the score crosses its midpoint), with that bracket and
the window in the evidence.
Changes of the same kind and direction whose steps lie within one snapshot of each other are one
phase change (its step: that of the largest move among them), listing every head; a head without a
sharp move of its own joins it where, over the change's window, it moved the same way by at least
half the change's largest move (and `min_range`): it moved with the others.

Each is aligned with the loss: the repeated-sequence loss and the in-context score before and after
the window, and the training loss curve over it (a bump: the curve rising above both ends; a
plateau's end: the curve flat over the span before the window, then falling in it).

Attention entropy leaving the untrained model is no phase change: every head moves away from near-
uniform attention as training starts, so an entropy move whose window starts at the first snapshot
is not reported (the doctor's `attention_collapse` reads a collapse from the records at any step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

__all__ = ["KINDS", "Move", "group_moves", "loss_evidence", "phase_changes", "sharp_moves"]

# score name in a snapshot's reading -> (kind when it rises, kind when it falls)
KINDS = {"induction": ("induction_heads", "induction_heads_lost"),
         "previous_token": ("previous_token_heads", "previous_token_heads_lost"),
         "duplicate_token": ("duplicate_heads", "duplicate_heads_lost"),
         "sink": ("sink_heads", "sink_heads_lost"),
         "entropy": ("entropy_spread", "entropy_collapse")}
WINDOW = 0.2  # the window a sharp move is measured over, as a fraction of the run's snapshots
SHARP = 0.5  # ... and the share of the head's range it must cover
MIN_RANGE = 0.15  # a score's range over the run below this is no phase (scores and entropy are 0..1)
PLATEAU = 0.02  # the loss moving less than this fraction over the span before a change: a plateau


@dataclass(frozen=True)
class Move:
    """One head's sharp move: snapshot indices of its window and of its midpoint crossing."""

    layer: int
    head: int
    start: int
    end: int
    mid: int
    at: float  # where it crossed half its move: a fractional snapshot index in (mid - 1, mid]
    before: float
    after: float
    range: float


def finite(values: Sequence[Any]) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def sharp_moves(series: Sequence[float], *, window: float = WINDOW, sharp: float = SHARP,
                min_range: float = MIN_RANGE) -> list[tuple[int, int, int]]:
    """(start, end, mid) snapshot indices of the steepest rise and the steepest fall of one series
    that cover `sharp` of its range within the window; mid: the first index past half the move."""
    n = len(series)
    if n < 3 or not finite(series):
        return []
    spread = max(series) - min(series)
    if spread < min_range:
        return []
    k = max(1, round(window * (n - 1)))
    deltas = [(series[i + k] - series[i], i) for i in range(n - k)]
    found = []
    steepest = (max(deltas, key=lambda d: d[0]), min(deltas, key=lambda d: d[0]))  # the earliest of ties
    for (delta, i), sign in zip(steepest, (1, -1)):
        if delta * sign < sharp * spread:
            continue
        found.append((i, i + k, crossing(series, i, i + k)[0]))
    return found


def crossing(series: Sequence[float], start: int, end: int) -> tuple[int, float]:
    """(mid, at): the first index past half of the move from `start` to `end`, and where between mid - 1
    and mid the series crossed that half, read linearly."""
    delta = series[end] - series[start]
    half = series[start] + delta / 2
    mid = next(j for j in range(start + 1, end + 1) if (series[j] - half) * delta >= 0)
    step = series[mid] - series[mid - 1]
    return mid, mid - 1 + ((half - series[mid - 1]) / step if step else 1.0)


def step_at(steps: Sequence[int], at: float) -> int:
    """The training step at a fractional snapshot index, between the two snapshots' steps."""
    i = min(int(at), len(steps) - 2)
    return round(steps[i] + (at - i) * (steps[i + 1] - steps[i]))


def head_moves(grids: Sequence[Sequence[Sequence[float]]], **options: Any) -> list[Move]:
    """Sharp moves of every head in grids [snapshot][layer][head]."""
    moves = []
    for layer in range(len(grids[0])):
        for head in range(len(grids[0][layer])):
            series = [g[layer][head] for g in grids]
            for start, end, mid in sharp_moves(series, **options):
                moves.append(Move(layer, head, start, end, mid, crossing(series, start, end)[1], series[start],
                                  series[end], max(series) - min(series)))
    return moves


def group_moves(moves: list[Move]) -> list[list[Move]]:
    """Moves whose midpoints lie within one snapshot of the group's, in step order."""
    groups: list[list[Move]] = []
    for move in sorted(moves, key=lambda m: (m.mid, m.layer, m.head)):
        if groups and move.mid - groups[-1][-1].mid <= 1:
            groups[-1].append(move)
        else:
            groups.append([move])
    return groups


def loss_at(curve: Sequence[tuple[int, float]], step: int) -> float | None:
    """The logged loss at the last logged step <= `step` (None before the first)."""
    found = None
    for s, value in curve:
        if s > step:
            break
        found = value
    return found


def loss_evidence(curve: Sequence[tuple[int, float]], start: int, end: int) -> dict[str, Any] | None:
    """What the training loss did over steps [start, end]: its value at both ends, a bump (the
    highest loss inside above both ends, in loss units, 0 when none) and whether the span of the
    same length before `start` was a plateau whose end this is (the loss falling over the window)."""
    before, after = loss_at(curve, start), loss_at(curve, end)
    inside = [v for s, v in curve if start <= s <= end and math.isfinite(v)]
    if before is None or after is None or not inside:
        return None
    earlier = loss_at(curve, start - (end - start))
    flat = (earlier is not None and abs(earlier - before) <= PLATEAU * abs(before)
            and start - (end - start) >= curve[0][0])
    return {"before": before, "after": after, "bump": max(0.0, max(inside) - max(before, after)),
            "plateau_end": bool(flat and after < before * (1 - PLATEAU))}


def series_evidence(values: Sequence[float | None], start: int, end: int) -> dict[str, float] | None:
    a, b = values[start], values[end]
    return None if a is None or b is None else {"before": a, "after": b}


def phase_changes(steps: Sequence[int], grids: dict[str, Sequence], *, repeat_loss: Sequence[float | None] = (),
                  icl_score: Sequence[float | None] = (), loss_curve: Sequence[tuple[int, float]] = (),
                  **options: Any) -> list[dict[str, Any]]:
    """The run's phase changes: grids maps a score name of KINDS to [snapshot][layer][head] values
    at `steps`; repeat_loss and icl_score one value per snapshot (None where unknown); loss_curve
    (step, training loss) pairs. Each: {"kind", "step", "heads": [[layer, head]], "evidence"}."""
    out = []
    for name, grid in grids.items():
        if name not in KINDS or len(grid) != len(steps):
            continue
        every = [m for m in head_moves(grid, **options) if not (name == "entropy" and m.start == 0)]
        for group in group_moves(every):
            rise = [m for m in group if m.after > m.before]
            fall = [m for m in group if m.after <= m.before]
            for moves, kind in ((rise, KINDS[name][0]), (fall, KINDS[name][1])):
                if moves:
                    taken = {(m.layer, m.head) for m in every if (m.after > m.before) == (kind == KINDS[name][0])}
                    moves = moves + companions(grid, moves, taken, options.get("min_range", MIN_RANGE))
                    out.append(change(kind, name, moves, steps, repeat_loss, icl_score, loss_curve))
    return sorted(out, key=lambda c: (c["step"], c["kind"]))


def companions(grid: Sequence, moves: list[Move], taken: set[tuple[int, int]], min_range: float) -> list[Move]:
    """Heads that moved with a change without a sharp move of their own (their steepest window fell just
    short): over the change's window, the same way, by at least half its largest move and `min_range`."""
    start, end = min(m.start for m in moves), max(m.end for m in moves)
    largest = max(abs(m.after - m.before) for m in moves)
    sign = 1 if moves[0].after > moves[0].before else -1
    found = []
    for layer in range(len(grid[0])):
        for head in range(len(grid[0][layer])):
            series = [g[layer][head] for g in grid]
            if (layer, head) in taken or not finite(series):
                continue
            delta = series[end] - series[start]
            if delta * sign >= max(min_range, 0.5 * largest):
                mid, at = crossing(series, start, end)
                found.append(Move(layer, head, start, end, mid, at, series[start], series[end], max(series) - min(series)))
    return found


def change(kind: str, score: str, moves: list[Move], steps: Sequence[int], repeat_loss: Sequence[float | None],
           icl_score: Sequence[float | None], loss_curve: Sequence[tuple[int, float]]) -> dict[str, Any]:
    """One phase change of heads that moved together, with its evidence."""
    lead = max(moves, key=lambda m: abs(m.after - m.before))
    start, end = min(m.start for m in moves), max(m.end for m in moves)
    evidence: dict[str, Any] = {
        "score": score, "from_step": steps[start], "to_step": steps[end],
        "crossed_between": [steps[lead.mid - 1], steps[lead.mid]],  # the snapshots bracketing the step
        "per_head": [{"layer": m.layer, "head": m.head, "before": m.before, "after": m.after, "range": m.range,
                      "step": step_at(steps, m.at)} for m in moves]}
    if len(repeat_loss) == len(steps):
        evidence["repeat_loss"] = series_evidence(repeat_loss, start, end)
    if len(icl_score) == len(steps):
        evidence["icl_score"] = series_evidence(icl_score, start, end)
    if loss_curve:
        evidence["loss"] = loss_evidence(loss_curve, steps[start], steps[end])
    return {"kind": kind, "step": step_at(steps, lead.at), "heads": sorted([m.layer, m.head] for m in moves),
            "evidence": evidence}
