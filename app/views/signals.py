"""Training dynamics, part two: every other signal training logs, drawn as logged.

Learning rate, gradient norm, step time and tokens per second, dead / saturated share per MLP
layer, and (runs trained since the run doctor logs them) the largest attention logit per head,
the residual stream's rms per layer and the largest |logit|. Rows come from `app.series`; a
signal this run did not log is said so in a caption instead of an empty chart.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from app import axes, charts, series
from app.legends import PAGE_PX
from app.views.common import show
from app.views.controls import curve_controls, smoothed_frame

HALF_PX, THIRD_PX = (PAGE_PX - 16) / 2, (PAGE_PX - 32) / 3  # a chart in st.columns(2) / (3)
NOT_LOGGED = "not logged by this run (it was trained before training logged it)"
TOKENS_UNTOLD = ("this run logged no tokens seen, so there is no rate to draw: give the Monitor the tokens "
                 "of one step, Monitor(..., tokens_per_step=batch_size * context)")


def section(records: list[dict[str, Any]], marks: pd.DataFrame, model: dict[str, Any] | None = None) -> None:
    """`model`: run.json's: its `act_fn` (the non-linearity) says what a "saturated" share is, and
    a Monitor's says why a signal was not measured (`activations`: "not measured: ...")."""
    model = model if isinstance(model, dict) else {}
    st.subheader("Training signals")
    mode, weight = curve_controls("signals")
    left, right = st.columns(2)
    steps = axes.x_range(r["step"] for r in records)  # every chart of the section over the same steps
    draw = lambda chart, where: show(charts.with_findings(chart, marks), where, stretch=True)  # noqa: E731
    optimiser(records, weight, mode, draw, left, right, steps)
    throughput(records, weight, mode, draw, left, right, steps)
    mlp_health(records, draw, left, right, steps, model.get("act_fn"), why_not(model, "activations"))
    growth(records, draw, steps, model)


def why_not(model: dict[str, Any], key: str) -> str:
    """Why the run has no `key`: the reason the Monitor wrote in run.json's model ("not measured:
    the non-linearity is not a module (a function call)"), else a run that predates it."""
    said = model.get(key)
    return f"{said} (run.json)" if isinstance(said, str) and said.startswith("not measured") else NOT_LOGGED


def one_curve(records: list[dict[str, Any]], key: str, name: str, title: str, y: str, weight: float,
              mode: str, steps: list[float] | None) -> Any | None:
    rows = series.rows(records, {name: key}, y)
    return None if not rows else curve(rows, y, title, weight, mode, steps)


def curve(rows: list[dict], y: str, title: str, weight: float, mode: str, steps: list[float] | None) -> Any:
    """One signal over steps, on the y axis `mode` gives it (`app.axes.choose_y`: auto turns log
    where the values span orders of magnitude, and the chart says so)."""
    axis = axes.choose_y([r[y] for r in rows], mode)
    return charts.smoothed_over_steps(smoothed_frame(rows, y, "curve", weight), y, "curve",
                                      charts.titled(title, axis.note), log=axis.log, x_domain=steps)


def optimiser(records, weight, mode, draw, left, right, steps) -> None:
    lr = one_curve(records, "lr", "learning rate", "learning rate (as scheduled)", "learning rate", 0.0,
                   "linear", steps)
    grad = one_curve(records, "grad_norm", "gradient norm", "gradient norm (before clipping)", "grad norm",
                     weight, mode, steps)
    for chart, where, what in ((lr, left, "learning rate"), (grad, right, "gradient norm")):
        if chart is None:
            where.caption(f"{what}: {NOT_LOGGED}")
        else:
            draw(chart, where)


def throughput(records, weight, mode, draw, left, right, steps) -> None:
    time = one_curve(records, "step_time_ms", "step time", "time per step", "step time (ms)", weight, mode, steps)
    if time is None:
        left.caption(f"step time and tokens per second: {NOT_LOGGED}")
        return
    draw(time, left)
    if not series.logged(records, "tokens"):  # no chart of nothing: say why, and how to have one
        right.caption(f"tokens per second: {TOKENS_UNTOLD}")
        return
    rate = [{"step": s, "curve": "tokens per second", "tokens/s": v} for s, v in series.tokens_per_second(records)]
    draw(curve(rate, "tokens/s", "tokens per second", weight, mode, steps), right)
    st.caption("Step time is the wall time per step since the previous record (evals and saves left out); "
               "tokens per second = tokens trained between two records / (step time × steps between).")


SHARE_HEIGHT = 200  # px of a share chart's [0, 1] axis: series closer than 1 / SHARE_HEIGHT lie on one line


def mlp_health(records, draw, left, right, steps, act_fn: str | None = None, why_not: str | None = None) -> None:
    """Dead units and saturated activations per MLP layer, a line per layer named apart
    (`app.series.layer_labels`). A ReLU's "saturated" share is its outputs at exactly 0, which is
    sparsity, not saturation (a unit at 0 on some inputs still learns on others: the run doctor
    reads it so, and the training console's line says so): its chart is named for it. `why_not`:
    run.json's reason where they were not measured."""
    if not series.logged(records, "activations"):
        st.caption(f"Dead and saturated MLP units: {why_not or NOT_LOGGED}")
        return
    labels = series.layer_labels({r["layer"] for r in series.per_layer(records, "activations", "dead")})
    relu = act_fn == "relu"
    titles = {"dead": ("dead MLP units", "share of units"),
              "saturated": ("zero ReLU outputs (sparse, not saturated)", "share of ReLU outputs at 0") if relu
              else ("saturated MLP activations", "share of activations")}
    for where, field in ((left, "dead"), (right, "saturated")):
        rows = [{"step": r["step"], "layer": labels[r["layer"]], f"{field} share": r["value"]}
                for r in series.per_layer(records, "activations", field)]
        title, y_title = titles[field]
        note = series.one_line_note(rows, f"{field} share", "layer", 1 / SHARE_HEIGHT)  # one colour for many
        draw(charts.lines_over_steps(pd.DataFrame(rows), f"{field} share", "layer", charts.titled(title, note),
                                     domain=[0, 1], y_title=y_title, x_domain=steps, width=HALF_PX,
                                     height=SHARE_HEIGHT), where)
    flat = ("zero ReLU outputs = the share of this ReLU layer's outputs that are exactly 0 (sparse, not "
            "saturated: those units still learn on the inputs where they fire)" if relu else
            "saturated = the share of activations in the flat part of the non-linearity (|tanh| > 0.97, "
            "GELU input below -3, ReLU output 0)")
    st.caption("Per MLP layer, on the first validation batch at each eval (`probes.activations`): dead = the "
               f"share of units never active over the batch; {flat}. In the legend, 'block N post' is block "
               "N's MLP hidden layer (its hook_post), 'post_1' the second hidden layer of a deeper MLP; for a model "
               "of your own, 'block 0 ff.1' is the non-linearity module ff.1 of block 0; lines "
               "that cover each other are named under the chart's title.")


def growth(records, draw, steps, model: dict[str, Any]) -> None:
    """The run doctor's logit-growth inputs: max attention logit per head, residual rms, max |logit|
    (each unlogged one with run.json's reason where the Monitor gave one)."""
    heads = [{"step": r["step"], "layer": f"L{r['layer']}", "head": f"H{r['head']}", "max attention logit": r["value"]}
             for r in series.per_layer(records, "attn_logit_max")]
    positive = [r for r in heads if r["max attention logit"] > 0]  # a log axis has no room for <= 0
    rms = [{"step": r["step"], "layer": f"layer {r['layer']}", "residual rms": r["value"]}
           for r in series.per_layer(records, "resid_rms")]
    logit = series.rows(records, {"max |logit|": "logit_max"}, "max |logit|")
    left, mid, right = st.columns(3)
    if positive:
        draw(charts.lines_over_steps(pd.DataFrame(positive), "max attention logit", "head",
                                     "largest attention score per head", log=True, x_domain=steps,
                                     width=THIRD_PX, dash="layer"), left)  # colour: head; dash: layer
        if len(positive) < len(heads):
            left.caption(f"{len(heads) - len(positive)} values at or below 0 are left off the log axis.")
    else:
        left.caption(f"Largest attention score per head: {why_not(model, 'attention') if not heads else 'none above 0'}")
    for rows, where, y, color, title, key in (
            (rms, mid, "residual rms", "layer", "residual stream rms per layer", "resid_rms"),
            (logit, right, "max |logit|", "curve", "largest |logit| of the output", "logit_max")):
        if rows:
            draw(charts.lines_over_steps(pd.DataFrame(rows), y, color, title, log=True, x_domain=steps,
                                         width=THIRD_PX), where)
        else:
            where.caption(f"{title[0].upper() + title[1:]}: {why_not(model, key)}")
