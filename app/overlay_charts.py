"""Altair charts of several runs on shared axes (the Compare page's overlay): pure functions from
`app.overlay_data` rows to a chart, no Streamlit.

A run keeps one colour in every chart (the colour scale's domain is the list of chosen runs, in
order) and its name in the legend; a second series per run (train / val loss) is told apart by
the stroke dash. Where a run's values turn NaN or inf, a red rule marks the first such point,
its run in the tooltip, instead of a line that silently stops.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from app.charts import legend, step_axis, tooltips, x_scale, y_scale

TOKENS_TITLE = "tokens seen"


def x_axis(x: str, domain: list[float] | None = None) -> alt.X:
    """The shared x axis: whole steps, or tokens seen in SI units (1.2M); `domain` (`app.axes.x_range`)
    the same for every chart of the overlay."""
    if x == "step":
        return step_axis(domain)
    return alt.X("tokens:Q", title=TOKENS_TITLE, axis=alt.Axis(format="~s"), scale=x_scale(domain))


def run_colour(runs: list[str], columns: int = 2) -> alt.Color:
    """Colour by run, the same run the same colour in every chart, named in the legend."""
    return alt.Color("run:N", scale=alt.Scale(domain=runs, scheme="category10"), legend=legend(columns),
                     sort=runs, title=None)


def overlay_lines(frame: pd.DataFrame, x: str, y: str, runs: list[str], title: str | alt.TitleParams, *,
                  dash: str | None = None, log: bool = False, height: int = 220,
                  y_title: str | None = None, nan: list[dict] | None = None,
                  domain: list[float] | None = None, under: alt.TopLevelMixin | None = None,
                  legend_columns: int = 2, x_domain: list[float] | None = None) -> alt.TopLevelMixin:
    """One line per run (and per `dash` value: train / val) over `x` ("step" or "tokens");
    where `frame` has a `smoothed` column (the EMA) that line in front and the raw values faint
    behind it, as TensorBoard draws them; a red rule at each `nan` row ({run, step, tokens, what});
    `under` (the g/w/u band) drawn first; `legend_columns` 1 for a narrow chart; `x_domain` the
    x range every chart of a figure shares."""
    tooltip = tooltips(c for c in ("run", dash, "step", "tokens", y, "smoothed") if c and c in frame.columns)
    base = alt.Chart(frame, title=title).encode(x=x_axis(x, x_domain), color=run_colour(runs, legend_columns),
                                                tooltip=tooltip)
    if dash:
        base = base.encode(strokeDash=alt.StrokeDash(  # above the plot: a second legend below is cut off
            f"{dash}:N", legend=alt.Legend(orient="top", direction="horizontal", title=None, labelLimit=0,
                                         symbolType="stroke")))
    y_enc = dict(scale=y_scale(log, domain), title=y_title or y)
    if "smoothed" in frame.columns:
        layers = [base.mark_line(opacity=0.25, clip=True).encode(y=alt.Y(f"{y}:Q", **y_enc)),
                  base.mark_line(clip=True).encode(y=alt.Y("smoothed:Q", **y_enc))]
    else:
        layers = [base.mark_line(point=len(frame) < 80, clip=True).encode(y=alt.Y(f"{y}:Q", **y_enc))]
    if under is not None:
        layers.insert(0, under)
    if nan:
        layers.append(nan_rules(nan, x))
    return alt.layer(*layers).properties(height=height)


def nan_rules(rows: list[dict], x: str) -> alt.LayerChart:
    """Red rules at the first NaN of each run, labelled NaN at the top (left of the rule: one at the
    last step stays inside the plot), the run in the tooltip."""
    frame = pd.DataFrame(rows, columns=["run", "step", "tokens", "what"]).assign(label="NaN")
    base = alt.Chart(frame).encode(x=alt.X(f"{x}:Q"), tooltip=tooltips(["what", "run", "step", "tokens"]))
    return alt.layer(base.mark_rule(color="red", strokeWidth=2),
                     base.mark_text(color="red", dy=-6, fontSize=10, align="right", dx=-3).encode(
                         y=alt.value(0), text="label:N"))
