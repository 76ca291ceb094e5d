"""Training dynamics: when did each head collapse or diverge, and which parameters barely move?"""

from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from app import axes, charts, run_files, series
from app.legends import PAGE_PX
from app.logs import history_only
from app.views import doctor, live, signals
from app.views.common import Selection, page, scroll_to, show
from probes.timeline import uniform_series_entropy
from probes.update_parts.report import GROUPS


@page("Training dynamics", "When did each head collapse or diverge, and which parameters barely move?",
      needs_model=False)
def render(sel: Selection) -> None:
    if history_only(sel.run.path):
        st.info("This is another trainer's training log: the Overview shows its loss curves and the run "
                "doctor's reading of it; the signals here (entropy per head, g/w/u) are a run directory's.")
        return
    if not sel.run.is_run:
        st.info("A lone snapshot has no training history: open a run directory.")
        return
    follow = live.follow_toggle(sel.run, "follow")
    live.live(body, follow)(sel, follow)


def body(sel: Selection, follow: bool = False) -> None:
    if follow:
        live.rerun_if_snapshots_changed(sel.run)  # the sidebar's slider must offer a new snapshot
    history = run_files.metrics_log(sel.run.path)
    records = history.records
    if not records:
        st.info("No metrics yet: training has not logged its first step.")
        return
    st.caption(run_files.records_caption(history))
    st.caption("Dashed rules mark where the run doctor's findings start (red failed, orange warning, "
               "blue info; hover one for its code and title): see the Overview for the diagnosis.")
    marks = doctor.marks(sel.run)
    entropy_over_steps(records, marks, run_files.trained_context(sel.run.path))
    updates_over_steps(sel, marks)
    model = run_files.run_info(sel.run.path).get("model")
    signals.section(records, marks, model)


def entropy_rows(records: list[dict]) -> tuple[list[dict], list[tuple[int, int]]]:
    """Rows {step, layer, head, entropy (nats)} (None where not finite), and (layer, step) of each NaN."""
    rows, bad = [], []
    for r in series.per_layer(records, "attn_entropy"):
        finite = math.isfinite(r["value"])
        rows.append({"step": r["step"], "layer": int(r["layer"]), "head": f"head {r['head']}",
                     "entropy (nats)": r["value"] if finite else None})
        if not finite:
            bad.append((int(r["layer"]), r["step"]))
    return rows, bad


def entropy_over_steps(records: list[dict], marks: pd.DataFrame, n_ctx: int | None) -> None:
    st.subheader("Attention entropy per head")
    rows, bad = entropy_rows(records)
    if not rows:
        st.info("This run logged no attention entropy (an MLP-family model has none).")
        return
    uniform = None if n_ctx is None else uniform_series_entropy(n_ctx)
    c1, c2 = st.columns(2)
    norm = c1.toggle("divide by uniform attention's entropy (1 = uniform)", key="entropy_norm",
                     disabled=uniform is None)
    shared = c2.toggle("same y-axis for every layer", key="entropy_shared")
    zoom = c2.toggle("zoom each y-axis to its lines", key="entropy_zoom", disabled=shared,
                     help="Off: every axis starts at 0, so a flat line looks flat. On: each axis spans only its "
                          "own lines, which makes small moves visible (and flat lines look dramatic).")
    y = "entropy / uniform" if norm else "entropy (nats)"
    frame = pd.DataFrame(series.normalised(rows, "entropy (nats)", uniform, y) if norm else rows)
    level = 1.0 if norm else uniform
    top = max([v for v in frame[y] if v is not None and math.isfinite(v)] + ([level] if level else []), default=1.0)
    layers = sorted(frame["layer"].unique())
    steps = axes.x_range(frame["step"])  # every layer's chart over the same steps
    columns = st.columns(min(2, len(layers)))
    for i, layer in enumerate(layers):
        chart = charts.lines_over_steps(frame[frame["layer"] == layer].drop(columns="layer"), y, "head",
                                        f"layer {layer}", height=180, domain=[0, top * 1.05] if shared else None,
                                        zero=not zoom, x_domain=steps,
                                        width=PAGE_PX / len(columns))
        if level is not None:
            chart = chart + charts.level_rule(level, "uniform attention")
        nan_steps = sorted({step for l, step in bad if l == layer})
        if nan_steps:
            chart = chart + charts.nan_marks(nan_steps[:1], "first NaN")
        show(charts.with_findings(chart, marks), columns[i % len(columns)], stretch=True)
    st.caption(entropy_caption(n_ctx, uniform))


def entropy_caption(n_ctx: int | None, uniform: float | None) -> str:
    text = "A line falling to 0 is a head collapsing to one-hot; a red rule marks where values turned NaN."
    if uniform is None:
        return text + " This run's run.json does not give its context length, so no uniform line."
    return (text + f" Dashed grey: uniform attention over this run's {n_ctx} positions, ln({n_ctx}!)/{n_ctx} = "
            f"{uniform:.3f} nats (the logged entropy averages every query row, row i seeing i + 1 keys, so "
            f"uniform is the mean of ln(k) over the rows, not ln({n_ctx}) = {math.log(n_ctx):.3f}).")


def updates_over_steps(sel: Selection, marks: pd.DataFrame) -> None:
    st.subheader("Update ratio u = |Δw| / |w| per step")
    try:
        history = run_files.update_history(sel.run.path, run_files.metrics_mtime(sel.run.path))
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
        chart = charts.lines_over_steps(frame, "u", "parameter", "u per parameter", log=True, height=300,
                                        y_title="u = |Δw| / |w|", width=PAGE_PX)
    else:
        frame = pd.DataFrame([{"step": r["step"], "group": r["group"], "u (median)": 10 ** r["median_log10_u"]}
                              for r in history.group_records() if r["median_log10_u"] is not None])
        chart = charts.lines_over_steps(frame, "u (median)", "group", "median u per parameter group",
                                        log=True, height=300, y_title="median u = |Δw| / |w|", width=PAGE_PX)
    lo, hi = (10 ** b for b in history.latest.band)
    show(charts.with_findings(charts.band_layer(lo, hi) + chart, marks), stretch=True)
    st.caption(updates_caption(sel.run.label, history.latest, lo, hi))
    table_at_step(sel.run.label, history)


def updates_caption(label: str, report, lo: float, hi: float) -> str:
    """What the u chart shows for this run: the band, and its slowest and fastest groups at the last step."""
    text = f"Shaded: the band {lo:.0e}..{hi:.0e}; dashed: makemore's target 1e-3."
    medians = {g: info["median_log10_u"] for g, info in report.groups.items()
               if info["median_log10_u"] is not None and g in GROUPS}
    if len(medians) < 2:
        return text
    slow, fast = min(medians, key=medians.get), max(medians, key=medians.get)
    return (text + f" At the last logged step ({report.step}), {label}'s slowest group is {slow} (median u "
            f"{10 ** medians[slow]:.2e}) and its fastest {fast} ({10 ** medians[fast]:.2e}), "
            f"{report.spread:.1f} orders of magnitude apart.")


U_NOMINAL_HELP = ("lr · g / w: the update plain SGD would make (the series' formula). It equals u only "
                  "for SGD without momentum; under Adam or momentum u (measured from the weights) is the truth.")


def table_at_step(label: str, history) -> None:
    st.subheader(f"g / w / u of {label}")
    linked = linked_step(history.steps)
    if linked is not None:  # a finding's link: show its step (the widget then keeps the user's choice)
        st.session_state["gwu_step"] = linked
        scroll_to("g / w / u of")  # what the link names lies below the charts
    live.newest_unless_moved("gwu_step", history.steps)
    step = st.select_slider("step", history.steps, key="gwu_step", help=live.FOLLOWS_NEWEST)
    report = history.at(step)
    rows = [{"parameter": name, "group": report.group_of[name], "g": row["g"], "w": row["w"], "u": row["u"],
             "u_nominal": row["u_nominal"], "log10 u": row["log10_u"],
             "flag": ", ".join(report.flags.get(name, []))} for name, row in report.parameters.items()]
    groups = {g: info["median_log10_u"] for g, info in report.groups.items()}
    spread = "-" if report.spread is None else f"{report.spread:.2f}"
    st.markdown(f"At step **{step}**, group medians (log10 u): " + ", ".join(
        f"{g} **{v:+.2f}**" for g, v in groups.items() if v is not None and g in GROUPS)
        + f"; spread **{spread}** orders of magnitude")
    frame = pd.DataFrame(rows)
    # one format call: a second one would reset the first's columns to pandas' default
    shown = {**{k: "{:.2e}" for k in ("g", "w", "u", "u_nominal")}, "log10 u": "{:+.2f}"}  # 3 significant digits
    st.dataframe(frame.style.format(shown, na_rep="-")
                 .map(lambda v: "color: #d62728; font-weight: bold" if v else "", subset=["flag"]),
                 width="stretch", height=table_height(len(frame)), column_config={
                     "g": st.column_config.Column(help="|gradient| of the parameter at this step"),
                     "w": st.column_config.Column(help="|w|, the parameter's norm"),
                     "u": st.column_config.Column(help="|Δw| / |w|: the update this step made, measured"),
                     "u_nominal": st.column_config.Column(help=U_NOMINAL_HELP)})
    st.caption(GWU_GLOSSARY)


GWU_GLOSSARY = ("g = rms of the parameter's gradient; w = rms of the parameter; u = rms(Δw) / rms(w), the "
                "update this step made, measured; u_nominal = lr · g / w, what plain SGD would make (equal to u "
                "only without momentum or Adam); log10 u against makemore's target of -3; flag: slow or fast "
                "(u below or above the band), frozen (no update), non-finite.")
ROW_PX = 35  # a table row's height in Streamlit's dataframe (its header's too)


def table_height(rows: int, most: int = 360) -> int:
    """A table's height in pixels: its rows and header, up to `most` (then it scrolls), so that a
    model with few parameters shows no empty rows below its last."""
    return min(most, (rows + 1) * ROW_PX + 3)


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


# the page: Streamlit runs this file afresh as `__main__` on each load (app/shell.py's navigation); it
# draws with the imported module, so that every load shares one copy of it; an import draws nothing
if __name__ == "__main__":
    from app.views import dynamics
    from app.views.common import current

    dynamics.render(current())  # app/main.py put the sidebar's selection in session state
