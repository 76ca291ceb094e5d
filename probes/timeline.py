"""A run's attention-entropy timeline from its logged history, torch-free: per head, the logged
step from which its entropy stayed collapsed, uniform or non-finite. `probes.degenerate` prints it
and the run doctor (`probes.diagnose`) reads it, so both judge a head by the same rule.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Iterable

from models.cli import to_jsonable
from probes.errors import ProbeInputError
from probes.thresholds import TIMELINE_COLLAPSE, TIMELINE_UNIFORM

__all__ = ["Timeline", "attn_entropy_grid", "entropy_timeline", "stayed_from", "uniform_series_entropy"]


def uniform_series_entropy(n: int) -> float:
    """The series' mean entropy of a causal head attending uniformly over n rows: ln(n!) / n."""
    return math.lgamma(n + 1) / n


def attn_entropy_grid(record: dict[str, Any]) -> list[list[float]] | None:
    """A metrics record's attn_entropy as [layer][head] floats (NaN for null/'nan'), or None."""
    raw = record.get("attn_entropy")
    if raw is None:
        return None
    if isinstance(raw, dict):
        try:
            raw = [row for _, row in sorted(raw.items(), key=lambda kv: int(kv[0]))]
        except ValueError:
            raise ProbeInputError(f"attn_entropy keys must be layer numbers, got {sorted(raw)}") from None
    if not isinstance(raw, list) or not all(isinstance(row, list) for row in raw):
        raise ProbeInputError(f"attn_entropy must map layers to lists over heads, got {str(raw)[:60]}")
    return [[float("nan") if v is None else float(v) for v in row] for row in raw]


@dataclass
class Timeline:
    """Per head, the first logged step from which the entropy stayed collapsed / uniform / NaN.

    `None` means it never did (or recovered before the last logged step). Entropies are compared
    to that of uniform attention over the training context, ln(n_ctx!)/n_ctx (`uniform_nats`).
    """

    steps: int
    first_step: int | None
    last_step: int | None
    uniform_nats: float
    thresholds: dict[str, float]
    collapsed: list[list[int | None]]
    uniform: list[list[int | None]]
    diverged: list[list[int | None]]
    final_entropy: list[list[float]]

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable(dataclasses.asdict(self))

    def format(self) -> str:
        if not self.steps:
            return "training timeline: metrics.jsonl has no attn_entropy records"
        lines = [f"training timeline over {self.steps} logged steps ({self.first_step}..{self.last_step}):"]
        for kind in ("collapsed", "uniform", "diverged"):
            for l, row in enumerate(getattr(self, kind)):
                lines += [f"  L{l}H{h} {kind} from step {s} (last entropy "
                          f"{self.final_entropy[l][h]:.3f} nats)" for h, s in enumerate(row) if s is not None]
        if len(lines) == 1:
            lines.append("  no head collapsed, went uniform or diverged and stayed so")
        return "\n".join(lines)


def stayed_from(steps: list[int], flags: list[bool]) -> int | None:
    """The step where the final run of True flags begins, or None if the last flag is False."""
    start = None
    for step, flag in zip(steps, flags):
        start = (step if start is None else start) if flag else None
    return start


def entropy_timeline(records: Iterable[dict[str, Any]], n_ctx: int, collapse: float = TIMELINE_COLLAPSE,
                     uniform: float = TIMELINE_UNIFORM) -> Timeline:
    """When each head's logged entropy collapsed (< collapse * uniform), went uniform
    (> uniform * uniform) or non-finite, and stayed so to the last logged step."""
    if n_ctx < 2:
        raise ProbeInputError(f"the timeline needs a training context of 2+ tokens, got {n_ctx}")
    if not 0.0 <= collapse < uniform <= 1.0:
        raise ProbeInputError(f"timeline thresholds need 0 <= collapse < uniform <= 1, got "
                              f"collapse={collapse}, uniform={uniform}")
    logged = sorted(((int(r.get("step", i)), g) for i, r in enumerate(records)
                     if (g := attn_entropy_grid(r)) is not None), key=lambda sg: sg[0])
    h_max = uniform_series_entropy(n_ctx)
    thresholds = {"collapse": collapse, "uniform": uniform}
    if not logged:
        return Timeline(0, None, None, h_max, thresholds, [], [], [], [])
    steps = [s for s, _ in logged]
    shape = [len(row) for row in logged[-1][1]]
    grids = [g for _, g in logged]

    def when(test) -> list[list[int | None]]:
        def head(l: int, h: int) -> int | None:
            seen = [(s, test(g[l][h])) for s, g in zip(steps, grids) if l < len(g) and h < len(g[l])]
            return stayed_from([s for s, _ in seen], [f for _, f in seen])
        return [[head(l, h) for h in range(n_heads)] for l, n_heads in enumerate(shape)]

    return Timeline(len(steps), steps[0], steps[-1], h_max, thresholds,
                    collapsed=when(lambda v: v < collapse * h_max),
                    uniform=when(lambda v: v > uniform * h_max),
                    diverged=when(lambda v: not math.isfinite(v)), final_entropy=grids[-1])
