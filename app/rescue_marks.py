"""The guard's rescues (`train.guard`) on the loss chart: a solid rule at each step the guard
rewound the run (green), at a stop (red), or where a watching guard would have acted (grey), its
record in the tooltip. Read from the records themselves, so the marks show before any diagnosis."""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd

__all__ = ["ACTIONS", "rescue_rows", "with_rescues"]

ACTIONS = {"rewind": ("rescued", "#2ca02c"), "stop": ("stopped by the guard", "#d62728"),
           "watch": ("the guard would act", "#7f7f7f")}


def rescue_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per record with a rescue: step, what (the legend's words) and a one-line summary."""
    rows = []
    for r in records:
        rescue = r.get("rescue")
        if not isinstance(rescue, dict):
            continue
        action = str(rescue.get("action", ""))
        kind = "watch" if action.startswith("watch") else action if action in ACTIONS else None
        if kind is None:
            continue
        restored = rescue.get("restored_step")
        cap = rescue.get("lr_cap")
        said = [str(rescue.get("trigger", "")), f"restored step {restored}" if restored is not None else "",
                f"learning rate capped at {cap:.3g}" if isinstance(cap, (int, float)) else ""]
        rows.append({"step": r["step"], "guard": ACTIONS[kind][0], "rescue": "; ".join(s for s in said if s)})
    return rows


def with_rescues(chart: alt.TopLevelMixin, records: list[dict[str, Any]]) -> alt.TopLevelMixin:
    """`chart` (steps on x) with the guard's rules over it; `chart` itself when it never acted."""
    rows = rescue_rows(records)
    if not rows:
        return chart
    names = [name for name, _ in ACTIONS.values()]
    rules = alt.Chart(pd.DataFrame(rows)).mark_rule(strokeWidth=2, opacity=0.8).encode(
        x="step:Q", color=alt.Color("guard:N", scale=alt.Scale(domain=names, range=[c for _, c in ACTIONS.values()]),
                                    legend=alt.Legend(title="guard")),
        tooltip=[alt.Tooltip("step:Q"), alt.Tooltip("guard:N"), alt.Tooltip("rescue:N")])
    return alt.layer(chart, rules).resolve_scale(color="independent")
