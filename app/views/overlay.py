"""Compare, part one: several runs' training logs on shared axes, and how their configs differ.

What a TensorBoard or W&B user expects of a run comparison: pick any runs, see loss (train solid,
val dashed), learning rate, attention entropy and the update ratio u per parameter group over
steps or tokens seen, each run one colour in every chart and named in the legend; the log-y
toggle and EMA smoothing the other pages have; then a table of the run.json fields that differ.
Rows come from `app.overlay_data` (logged values only), charts from `app.overlay_charts`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from app import axes, charts, overlay_charts, overlay_data, run_files, series
from app.views.common import Selection, first_line, show
from app.views.controls import curve_controls, smoothed_frame
from models.store.run import read_run_json
from probes.timeline import uniform_series_entropy
from probes.update_parts.report import GROUPS

MEAN_HEAD = "mean of the layer's heads"


def section(sel: Selection) -> None:
    """The runs overlaid and their config diff."""
    st.subheader("Runs overlaid")
    runs = {s.label: s for s in sel.sources if s.is_run}
    if not sel.run.is_run:
        st.info(f"{sel.run.label} is a lone snapshot: it has no training log to overlay. "
                "Pick runs below, or its snapshots further down.")
    if not runs:
        st.info("No runs to overlay: the app knows no run directory (only lone snapshots).")
        return
    infos = {label: run_info(source.path) for label, source in runs.items()}
    families = {label: kin(info) for label, info in infos.items()}
    chosen = st.multiselect("runs to overlay", list(runs), key=runs_key(sel),
                            default=overlay_data.default_runs(sel.run.label if sel.run.is_run else None, families),
                            help="Any runs the app knows; each keeps one colour in every chart.")
    if not chosen:
        st.info("Pick one or more runs to overlay.")
        return
    curves(chosen, {label: runs[label].path for label in chosen})
    config_diff(chosen, infos)


def kin(info: dict) -> tuple[str | None, str | None, str | None]:
    """A run's keys for the overlay's default pairing, closest first: preset, model class (a user's
    GPT, a Hugging Face architecture), family."""
    model = info.get("model") if isinstance(info.get("model"), dict) else {}
    return info.get("preset"), model.get("class") or model.get("architecture"), model.get("family")


def runs_key(sel: Selection) -> str:
    """The overlay's run picker's key (one per sidebar run: each opens on its own default)."""
    return f"overlay_runs:{sel.run.label}"


def run_info(path: Path) -> dict[str, Any]:
    """run.json as a dict; {"(unreadable)": message} when it is garbled, {} when there is none."""
    try:
        return read_run_json(path) or {}
    except Exception as exc:  # noqa: BLE001 - the diff shows it as a field of its own
        return {"(unreadable)": first_line(exc)}


def curves(chosen: list[str], paths: dict[str, Path]) -> None:
    logs = {label: run_files.metrics(paths[label]) for label in chosen}
    silent = [label for label in chosen if not logs[label]]
    if silent:
        st.info(f"No metrics yet from {', '.join(silent)}: training has not logged a step, so nothing to overlay.")
    c1, c2, c3 = st.columns([6, 6, 5])  # each radio's choices on one line at 1024 px
    x = overlay_data.XS[c1.radio("x-axis", list(overlay_data.XS), horizontal=True, key="overlay_x")]
    mode, weight = curve_controls("overlay", (c2, c3))
    if x == "tokens":
        untold = [label for label in logs if logs[label] and not overlay_data.logs_tokens(logs[label])]
        if untold:
            st.info(f"{', '.join(untold)} did not log the tokens seen at every step: left off the "
                    "tokens axis (switch to steps to see them).")
        silent += untold
    logs = {label: records for label, records in logs.items() if label not in silent}
    if not logs:
        return
    runs = list(logs)
    for label, records in logs.items():
        broke = next((r for r in records if r.get("diverged")), None)
        if broke is not None:
            reason = broke["diverged"].get("reason") if isinstance(broke["diverged"], dict) else broke["diverged"]
            st.warning(f"{label} diverged at step {broke['step']}: {reason} (red rules: its first NaN).")
    left, right = st.columns(2)
    span = axes.x_range(overlay_data.x_values(logs, x))  # one x range for every chart below
    losses(logs, x, runs, mode, weight, left, span)
    learning_rate(logs, x, runs, mode, right, span)
    entropy(logs, x, runs, weight, paths, span)
    updates(logs, x, runs, weight, paths, span)


def losses(logs, x, runs, mode, weight, where, span) -> None:
    rows = [row for label, records in logs.items() for row in overlay_data.scalar_rows(
        label, records, {"train loss": "train_loss", "val loss": "val_loss"}, "loss")]
    rows = overlay_data.on_axis(rows, x)
    if not rows:
        where.caption("loss: none of these runs logged a loss yet")
        return
    y = axes.choose_y([r["loss"] for r in rows], mode)
    chart = overlay_charts.overlay_lines(smoothed_frame(rows, "loss", "line", weight), x, "loss", runs,
                                         charts.titled("loss (solid: train, dashed: val)", y.note), dash="curve",
                                         log=y.log, y_title="loss (nats per token)", x_domain=span,
                                         nan=overlay_data.first_nonfinite(rows, "loss"))
    show(chart, where, stretch=True)


def learning_rate(logs, x, runs, mode, where, span) -> None:
    rows = overlay_data.on_axis([row for label, records in logs.items()
                                 for row in overlay_data.scalar_rows(label, records, {"lr": "lr"}, "learning rate")], x)
    if not rows:
        where.caption("learning rate: not logged by these runs")
        return
    y = axes.choose_y([r["learning rate"] for r in rows], mode, prefer_log=True)  # 0.05 beside 0.001
    drawn = [r for r in rows if not y.log or r["learning rate"] > 0 or not math.isfinite(r["learning rate"])]
    chart = overlay_charts.overlay_lines(pd.DataFrame(drawn), x, "learning rate", runs,
                                         charts.titled("learning rate (as scheduled)", y.note), log=y.log,
                                         x_domain=span, nan=overlay_data.first_nonfinite(rows, "learning rate"))
    show(chart, where, stretch=True)
    if len(drawn) < len(rows):
        where.caption(f"{len(rows) - len(drawn)} learning rates of 0 or below (a warmup's start) are left off "
                      "the log axis; choose linear to see them.")


def entropy(logs, x, runs, weight, paths, span) -> None:
    st.markdown("**Attention entropy per layer**")
    with_heads = [label for label, records in logs.items() if series.logged(records, "attn_entropy")]
    if not with_heads:
        st.caption("None of these runs logged attention entropy (an MLP-family model has none).")
        return
    n_heads = max((len(v) for label in with_heads for r in logs[label]
                  if isinstance(r.get("attn_entropy"), dict) for v in r["attn_entropy"].values()
                  if isinstance(v, list)), default=1)
    contexts = {label: trained_context(paths[label]) for label in with_heads}
    c1, c2 = st.columns(2)
    head = c1.selectbox("head", [MEAN_HEAD] + [f"head {h}" for h in range(n_heads)], key="overlay_head")
    can_divide = all(contexts.values())
    divide = c2.toggle("divide by uniform attention's entropy (1 = uniform)", value=True, key="overlay_entropy_norm",
                       disabled=not can_divide, help="Runs with different context lengths compare only this way: "
                       "uniform attention over n positions has entropy ln(n!)/n (the mean over the query rows).")
    divide = divide and can_divide
    y = "entropy / uniform" if divide else "entropy (nats)"
    index = None if head == MEAN_HEAD else int(head.split()[-1])
    rows = overlay_data.on_axis([row for label in with_heads for row in overlay_data.entropy_rows(
        label, logs[label], index, uniform_series_entropy(contexts[label]) if divide else None, y)], x)
    finite = [r[y] for r in rows if math.isfinite(r[y])]
    domain = [0.0, max(finite + [1.0 if divide else 0.0]) * 1.05] if finite else None  # one y range for all layers
    layers = sorted({r["layer"] for r in rows})
    columns = st.columns(min(2, len(layers)) or 1)
    for i, layer in enumerate(layers):
        mine = [r for r in rows if r["layer"] == layer]
        chart = overlay_charts.overlay_lines(smoothed_frame(mine, y, "line", weight), x, y, runs, f"layer {layer}",
                                             height=180, domain=domain, x_domain=span,
                                             nan=overlay_data.first_nonfinite(mine, y))
        show(chart, columns[i % len(columns)], stretch=True)
    what = "the mean over each layer's heads" if index is None else f"head {index} of each layer"
    st.caption(f"Attention entropy as logged at each eval, {what}"
               + (", divided by uniform attention's ln(n!)/n for each run's context n (1 = uniform, 0 = one-hot)."
                  if divide else " (nats)." + ("" if can_divide else " Some run's run.json does not give its context "
                                                "length, so entropy cannot be divided by uniform's."))
               + " A red rule marks a run's first NaN.")


def trained_context(path: Path) -> int | None:
    """The run's context length from run.json; None when it does not say or cannot be read."""
    try:
        return run_files.trained_context(path)
    except Exception:  # noqa: BLE001 - a garbled run.json: the config diff says so, entropy stays in nats
        return None


def updates(logs, x, runs, weight, paths, span) -> None:
    st.markdown("**Update ratio u = |Δw| / |w|: median per parameter group**")
    y = "median u"
    rows, unread = [], []
    for label, records in logs.items():
        try:
            history = run_files.update_history(paths[label], run_files.metrics_mtime(paths[label]))
        except ValueError as exc:
            unread.append(f"{label}: {first_line(exc)}")
            continue
        rows += overlay_data.u_rows(label, history.group_records(), overlay_data.tokens_by_step(records), y)
    for line in unread:
        st.caption(line)
    rows = overlay_data.on_axis(rows, x)
    groups = [g for g in GROUPS if any(r["group"] == g for r in rows)]
    columns = st.columns(3)
    for i, group in enumerate(groups):
        mine = [r for r in rows if r["group"] == group]
        chart = overlay_charts.overlay_lines(smoothed_frame(mine, y, "line", weight), x, y, runs, group, log=True,
                                             height=160, y_title="median u", under=charts.band_layer(),
                                             legend_columns=1, x_domain=span)
        show(chart, columns[i % 3], stretch=True)
    if groups:
        lo, hi = charts.BAND
        st.caption(f"Median u per group as `probes.updates` reads the run's log; shaded: the band {lo:.0e}..{hi:.0e}, "
                   "dashed: makemore's target 1e-3. A step where a group has no positive finite u is left out.")


def config_diff(chosen: list[str], infos: dict[str, dict[str, Any]]) -> None:
    st.subheader("Config diff")
    if len(chosen) < 2:
        st.info("Pick two or more runs above to see how their run.json configs differ.")
        return
    missing = [label for label in chosen if not infos[label]]
    if missing:
        st.info(f"{', '.join(missing)} has no run.json: its fields read (absent).")
    launch = st.toggle("include how each run was launched (command line, start time)", key="overlay_launch")
    rows = overlay_data.config_diff({label: infos[label] for label in chosen}, launch=launch)
    if not rows:
        st.success(f"The configs of {', '.join(chosen)} are identical"
                   + ("." if launch else " (apart from how each was launched)."))
        return
    st.dataframe(pd.DataFrame(rows).set_index("field"), width="stretch")
    st.caption(f"{len(rows)} run.json fields differ (nested fields as dotted names; the rest are equal).")
