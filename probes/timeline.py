"""A run's attention-entropy timeline from its logged history, torch-free: per head, the logged
step from which its entropy stayed collapsed, uniform or non-finite. `probes.degenerate` prints it
and the run doctor (`probes.diagnose`) reads it, so both judge a head by the same rule.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Any, Iterable

from models.cli import to_jsonable
from models.store.record_check import RunShape, layers_problem
from probes.errors import ProbeInputError
from probes.thresholds import TIMELINE_COLLAPSE, TIMELINE_UNIFORM

__all__ = ["Timeline", "attn_entropy_grid", "entropy_timeline", "stayed_from", "uniform_series_entropy"]

log = logging.getLogger(__name__)


def uniform_series_entropy(n: int) -> float:
    """The series' mean entropy of a causal head attending uniformly over n rows: ln(n!) / n."""
    return math.lgamma(n + 1) / n


def attn_entropy_grid(record: dict[str, Any], shape: RunShape | None = None) -> list[list[float]] | None:
    """A metrics record's attn_entropy as [layer][head] floats (NaN for null), or None when it
    logged none; a ProbeInputError saying what is wrong when it does not fit (`record_check`:
    {layer: [per head]}, the layers of the model once each, `shape`'s heads when given)."""
    raw = record.get("attn_entropy")
    if raw is None:
        return None
    why = layers_problem("attn_entropy", raw, shape)
    if why:
        raise ProbeInputError(why)
    return [[float("nan") if v is None else float(v) for v in raw[layer]]
            for layer in sorted(raw, key=lambda l: int(l))]


def logged_grids(records: Iterable[dict[str, Any]], shape: RunShape | None) -> tuple[list[tuple[int, Any]], int]:
    """(step, grid) of each record that logged attention entropy, in step order, and how many were
    skipped: a record whose entropy does not fit is left out with a warning (records read from a
    file passed the same check in the reader already)."""
    logged, skipped = [], 0
    for i, r in enumerate(records):
        try:
            grid = attn_entropy_grid(r, shape)
        except ProbeInputError as why:
            log.warning("timeline: skipping the record at step %s (%s)", r.get("step", f"#{i}"), why)
            skipped += 1
            continue
        if grid is not None:
            logged.append((int(r.get("step", i)), grid))
    return sorted(logged, key=lambda sg: sg[0]), skipped


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
    skipped: int = 0  # malformed records left out (the reader's and the timeline's, each warned about)

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable(dataclasses.asdict(self))

    def format(self) -> str:
        skipped = f"; {self.skipped} malformed record{'s' if self.skipped > 1 else ''} skipped" if self.skipped else ""
        if not self.steps:
            return f"training timeline: metrics.jsonl has no attn_entropy records{skipped}"
        lines = [f"training timeline over {self.steps} logged steps ({self.first_step}..{self.last_step}{skipped}):"]
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
                     uniform: float = TIMELINE_UNIFORM, *, shape: RunShape | None = None,
                     skipped: int = 0) -> Timeline:
    """When each head's logged entropy collapsed (< collapse * uniform), went uniform
    (> uniform * uniform) or non-finite, and stayed so to the last logged step. `shape`: the
    model's layers and heads, which each record's entropy must fit; `skipped`: records the
    reader already left out (`read_metrics_log`), counted in the result."""
    if n_ctx < 2:
        raise ProbeInputError(f"the timeline needs a training context of 2+ tokens, got {n_ctx}")
    if not 0.0 <= collapse < uniform <= 1.0:
        raise ProbeInputError(f"timeline thresholds need 0 <= collapse < uniform <= 1, got "
                              f"collapse={collapse}, uniform={uniform}")
    logged, bad = logged_grids(records, shape)
    skipped += bad
    h_max = uniform_series_entropy(n_ctx)
    thresholds = {"collapse": collapse, "uniform": uniform}
    if not logged:
        return Timeline(0, None, None, h_max, thresholds, [], [], [], [], skipped)
    steps = [s for s, _ in logged]
    heads_per_layer = [len(row) for row in logged[-1][1]]
    grids = [g for _, g in logged]

    def when(test) -> list[list[int | None]]:
        def head(l: int, h: int) -> int | None:
            seen = [(s, test(g[l][h])) for s, g in zip(steps, grids) if l < len(g) and h < len(g[l])]
            return stayed_from([s for s, _ in seen], [f for _, f in seen])
        return [[head(l, h) for h in range(n_heads)] for l, n_heads in enumerate(heads_per_layer)]

    return Timeline(len(steps), steps[0], steps[-1], h_max, thresholds,
                    collapsed=when(lambda v: v < collapse * h_max),
                    uniform=when(lambda v: v > uniform * h_max),
                    diverged=when(lambda v: not math.isfinite(v)), final_entropy=grids[-1], skipped=skipped)
