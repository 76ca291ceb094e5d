"""Development: what did each head become over training, and when did it change?"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import pandas as pd
import streamlit as st

from app import data
from app.views.common import Selection, page, show

# the score a heatmap shows -> its title (induction: Olsson et al.'s score on the random repeat)
TYPES = {"induction_repeat": "induction (Olsson, on a random repeat)", "previous_token": "previous token",
         "duplicate_token": "duplicate token", "sink": "sink (first position)", "induction": "induction (on the text)",
         "entropy": "normalised entropy"}
MANY_SNAPSHOTS = 200  # past this, the page says the first visit takes a while


@st.cache_data(max_entries=8, show_spinner="Reading every snapshot (cached beside each one afterwards)...")
def development(path: str, modified: float) -> dict[str, Any]:
    """`probes.development.run` on the run: its snapshots, phase changes and loss curve."""
    from probes import development as probe

    result = probe.run(path)
    return {**result.to_dict(), "loss_curve": result.loss_curve, "source": result.source, "notes": result.notes}


def run_modified(sel: Selection) -> float:
    """The newest modification time over the run's snapshots (a new or retrained one: read again)."""
    return max((data.mtime(p) for p in sel.run.snapshots()), default=0.0)


@page("Development", "What did each head become over training, and when did it change?", needs_model=True)
def render(sel: Selection) -> None:
    if not sel.run.is_run:
        st.info("A lone snapshot has no development: open a run directory with several snapshots.")
        return
    snaps = sel.run.snapshots()
    if len(snaps) > MANY_SNAPSHOTS:
        st.warning(f"{len(snaps)} snapshots: each is read once (then cached beside it); this may take a while.")
    result = development(str(sel.run.path), run_modified(sel))
    snapshots = result["snapshots"]
    st.caption(f"{len(snapshots)} snapshots read on {result['source']}. Each phase change's heads are ablated "
               "(their output set to zero) at the snapshot ending it: the repeat's loss with them and without them. "
               "Each cell is one head at one snapshot; click one to open that snapshot's Attention page.")
    changes_table(result, sel)
    loss_chart(result)
    kind = st.radio("score", [k for k in TYPES if k == "entropy" or k in snapshots[0]["scores"]],
                    format_func=TYPES.__getitem__, horizontal=True, key="development_score")
    show(heatmap(snapshots, kind, sel.run.label), stretch=True)
    missing = sorted({m for s in snapshots for m in s.get("missing") or []}) + result["notes"]
    for line in missing:
        st.caption(f"Not read: {line}")


def attention_link(run: str, snapshot: str) -> str:
    """The Attention page of one snapshot, as the app's addresses name it."""
    return "attention?" + urlencode({"run": run, "snapshot": snapshot})


def heatmap_rows(snapshots: list[dict[str, Any]], kind: str, run: str) -> pd.DataFrame:
    """One row per (snapshot, head): a head keeps its own row across snapshots (L{layer}H{head})."""
    rows = []
    for s in snapshots:
        grid = s["entropy"] if kind == "entropy" else s["scores"][kind]
        for layer, heads in enumerate(grid):
            for head, value in enumerate(heads):
                rows.append({"step": s["step"], "head": f"L{layer}H{head}", "score": value,
                             "snapshot": s["snapshot"], "link": attention_link(run, s["snapshot"])})
    return pd.DataFrame(rows)


def heatmap(snapshots: list[dict[str, Any]], kind: str, run: str) -> Any:
    import altair as alt

    frame = heatmap_rows(snapshots, kind, run)
    heads = list(dict.fromkeys(frame["head"]))
    return alt.Chart(frame, title=f"{TYPES[kind]} per head over snapshots").mark_rect().encode(
        x=alt.X("step:O", title="snapshot step"),
        # every head named: vega drops overlapping labels by default, and half the rows went unnamed
        y=alt.Y("head:N", sort=heads, title=None, axis=alt.Axis(labelOverlap=False, labelFontSize=11)),
        color=alt.Color("score:Q", scale=alt.Scale(domain=[0, 1], scheme="viridis"), title=None),
        href="link:N",
        tooltip=["head", "step", alt.Tooltip("score:Q", format=".3f"), "snapshot"],
    ).properties(height=max(80, 20 * len(heads)))


def loss_chart(result: dict[str, Any]) -> None:
    """The training loss (and the repeat's loss per snapshot), each phase change a rule at its step."""
    import altair as alt

    lines = [{"step": s, "loss": v, "curve": "training loss"} for s, v in result["loss_curve"]]
    lines += [{"step": s["step"], "loss": s["repeat_loss"], "curve": "repeat's second half"}
              for s in result["snapshots"] if s["repeat_loss"] is not None]
    lines += [{"step": s["step"], "loss": s["loss"], "curve": "loss on the text"}
              for s in result["snapshots"] if s["loss"] is not None]
    if not lines:
        st.info("No loss logged and none read: the phase changes are listed above.")
        return
    base = alt.Chart(pd.DataFrame(lines), title="loss, with the phase changes").encode(
        x=alt.X("step:Q"), y=alt.Y("loss:Q", scale=alt.Scale(zero=True)), color=alt.Color("curve:N", title=None))
    snapshots = base.mark_point(filled=True, size=30).transform_filter(alt.datum.curve != "training loss")
    chart = base.mark_line() + snapshots  # a dot per snapshot, none on every logged step
    changes = [{"step": c["step"], "change": f"{c['kind']} ({heads_text(c['heads'])})"}
               for c in result["phase_changes"]]
    if changes:
        rules = alt.Chart(pd.DataFrame(changes)).mark_rule(strokeDash=[4, 3], color="crimson").encode(
            x="step:Q", tooltip=["change", "step"])
        chart = chart + rules
    show(chart.properties(height=220), stretch=True)


def heads_text(heads: list[list[int]]) -> str:
    return ", ".join(f"L{layer}H{head}" for layer, head in heads)


def ablation_cell(ablation: dict[str, Any] | None) -> str:
    """The repeat's loss at the snapshot ending the change, with the heads and with them ablated."""
    if not ablation:
        return "not ablated"
    loss = ablation["repeat_loss"]
    return f"{loss['with']:.2f} -> {loss['without']:.2f} at step {ablation['step']}"


def changes_table(result: dict[str, Any], sel: Selection) -> None:
    changes = result["phase_changes"]
    if not changes:
        st.info("No phase change: no head's type score or entropy moved by half its range within a fifth of "
                "the run's snapshots.")
        return
    by_step = {s["step"]: s["snapshot"] for s in result["snapshots"]}
    rows = []
    for c in changes:
        ev = c["evidence"]
        repeat = ev.get("repeat_loss") or {}
        rows.append({"step": c["step"], "kind": c["kind"], "heads": heads_text(c["heads"]),
                     "between snapshots": "{}..{}".format(*ev["crossed_between"]),
                     "window": f"{ev['from_step']}..{ev['to_step']}",
                     "repeat loss": (f"{repeat['before']:.2f} -> {repeat['after']:.2f}" if repeat else "not read"),
                     "without its heads": ablation_cell(c.get("ablation")),
                     "attention": attention_link(sel.run.label, by_step[ev["crossed_between"][1]])})
    st.dataframe(pd.DataFrame(rows), hide_index=True, column_config={
        "attention": st.column_config.LinkColumn("attention", display_text="open at this step")})


if __name__ == "__main__":
    from app.views import development as view
    from app.views.common import current

    view.render(current())  # app/main.py put the sidebar's selection in session state
