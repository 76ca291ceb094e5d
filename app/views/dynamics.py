"""Training dynamics: when did each head collapse or diverge, and which parameters barely move?"""

from __future__ import annotations

import math
from datetime import timedelta

import pandas as pd
import streamlit as st

from app import charts, data
from app.views import doctor
from app.views.common import Selection, page, show
from probes.update_report import GROUPS


@page("Training dynamics", "When did each head collapse or diverge, and which parameters barely move?")
def render(sel: Selection) -> None:
    if not sel.run.is_run:
        st.info("A lone snapshot has no training history: open a run directory.")
        return
    live = data.is_training(sel.run.path)
    follow = st.toggle("follow the run live (re-read every 3 s)", value=live, key="follow")
    if follow:
        st.fragment(run_every=timedelta(seconds=3))(body)(sel)
    else:
        body(sel)


def body(sel: Selection) -> None:
    records = data.metrics(sel.run.path)
    if not records:
        st.info("No metrics yet: training has not logged its first step.")
        return
    st.caption(f"{len(records)} records, steps {records[0]['step']}..{records[-1]['step']}")
    st.caption("Dashed rules mark where the run doctor's findings start (red failed, orange warning, "
               "blue info; hover one for its code and title): see the Overview for the diagnosis.")
    marks = doctor.marks(sel.run)
    entropy_over_steps(records, marks)
    updates_over_steps(sel, marks)


def entropy_over_steps(records: list[dict], marks: pd.DataFrame) -> None:
    st.subheader("Attention entropy per head")
    rows, bad = [], []
    for r in records:
        for layer, heads in (r.get("attn_entropy") or {}).items():
            for h, value in enumerate(heads):
                finite = isinstance(value, (int, float)) and math.isfinite(value)
                rows.append({"step": r["step"], "layer": int(layer), "head": f"head {h}",
                             "entropy (nats)": value if finite else None})
                if not finite:
                    bad.append((int(layer), r["step"]))
    if not rows:
        st.info("This run logged no attention entropy (an MLP-family model has none).")
        return
    frame = pd.DataFrame(rows)
    layers = sorted(frame["layer"].unique())
    columns = st.columns(min(2, len(layers)))
    for i, layer in enumerate(layers):
        chart = charts.lines_over_steps(frame[frame["layer"] == layer].drop(columns="layer"),
                                        "entropy (nats)", "head", f"layer {layer}", height=180)
        nan_steps = sorted({step for l, step in bad if l == layer})
        if nan_steps:
            chart = chart + charts.nan_marks(nan_steps[:1], "first NaN")
        show(charts.with_findings(chart, marks), columns[i % len(columns)], stretch=True)
    st.caption("A line falling to 0 is a head collapsing to one-hot; a red rule marks where values turned NaN.")


def updates_over_steps(sel: Selection, marks: pd.DataFrame) -> None:
    st.subheader("Update ratio u = |Δw| / |w| per step")
    try:
        history = data.update_history(sel.run.path, data.metrics_mtime(sel.run.path))
    except ValueError as exc:
        st.info(str(exc))
        return
    singles = st.toggle("single parameters", key="single_params")
    if singles:
        frame = pd.DataFrame(history.records())
        names = list(dict.fromkeys(frame["name"]))
        chosen = st.multiselect("parameters", names, default=names[:4], key="params")
        frame = frame[frame["name"].isin(chosen)].rename(columns={"name": "parameter"})
        frame = frame[frame["u"].notna() & (frame["u"] > 0)][["step", "parameter", "group", "u", "g", "w"]]
        chart = charts.lines_over_steps(frame, "u", "parameter", "u per parameter", log=True, height=300)
    else:
        frame = pd.DataFrame([{"step": r["step"], "group": r["group"], "u (median)": 10 ** r["median_log10_u"]}
                              for r in history.group_records() if r["median_log10_u"] is not None])
        chart = charts.lines_over_steps(frame, "u (median)", "group", "median u per parameter group",
                                        log=True, height=300)
    lo, hi = (10 ** b for b in history.latest.band)
    show(charts.with_findings(charts.band_layer(lo, hi) + chart, marks), stretch=True)
    st.caption("Shaded: the healthy band; dashed: makemore's target 1e-3. Under SGD the series saw "
               "attention Q/K far below the MLP; Adam closes the gap.")
    table_at_step(history)


def table_at_step(history) -> None:
    st.subheader("The series' g / w / u table")
    linked = linked_step(history.steps)
    if linked is not None:  # a finding's link: show its step (the widget then keeps the user's choice)
        st.session_state["gwu_step"] = linked
    step = st.select_slider("step", history.steps, key="gwu_step",
                            **({} if linked is not None else {"value": history.steps[-1]}))
    report = history.at(step)
    rows = [{"parameter": name, "group": report.group_of[name], "g": row["g"], "w": row["w"], "u": row["u"],
             "u_nominal": row["u_nominal"], "log10 u": row["log10_u"],
             "flag": ", ".join(report.flags.get(name, []))} for name, row in report.parameters.items()]
    groups = {g: info["median_log10_u"] for g, info in report.groups.items()}
    spread = "-" if report.spread is None else f"{report.spread:.2f}"
    st.markdown("group medians (log10 u): " + ", ".join(
        f"{g} **{v:+.2f}**" for g, v in groups.items() if v is not None and g in GROUPS)
        + f"; spread **{spread}** orders of magnitude")
    frame = pd.DataFrame(rows)
    st.dataframe(frame.style.format({k: "{:.1e}" for k in ("g", "w", "u", "u_nominal")}, na_rep="-")
                 .format({"log10 u": "{:+.2f}"}, na_rep="-")
                 .map(lambda v: "color: #d62728; font-weight: bold" if v else "", subset=["flag"]),
                 width="stretch", height=360)


def linked_step(steps: list[int]) -> int | None:
    """The logged step nearest a `?step=N` link (the Overview's findings link here), once per link:
    None without one, or when this link was already applied and the user may have moved on."""
    wanted = st.query_params.get("step")
    if wanted is None or st.session_state.get("linked_step") == wanted:
        return None
    st.session_state["linked_step"] = wanted
    try:
        target = int(wanted)
    except ValueError:
        st.warning(f"?step={wanted} is not a step number: showing the last logged step")
        return None
    return min(steps, key=lambda s: (abs(s - target), s))
