"""Altair charts of probe results: pure functions from plain data to a chart, no Streamlit.

Colour scales are fixed to what the numbers mean (normalised entropy 0 = one-hot .. 1 =
uniform; the g/w/u band around 1e-3) so that two runs look alike when they behave alike, and
every mark carries a tooltip with the exact numbers.
"""

from __future__ import annotations

import math
from typing import Any

import altair as alt
import pandas as pd

from app.legends import legend, legend_columns

ENTROPY_SCALE = alt.Scale(scheme="viridis", domain=[0, 1])
BAND = (1e-4, 1e-2)  # the default g/w/u band; makemore's target is 1e-3



def tooltips(columns: Any) -> list[alt.Tooltip]:
    """One tooltip per column (a name, or a Tooltip made already), as Tooltip objects: the same spec
    as plain column names, but Altair then skips re-validating each name against its whole schema
    (half a line chart's build time)."""
    return [alt.Tooltip(c) if isinstance(c, str) else c for c in columns]


def entropy_grid(normalized: list[list[float]], verdicts: list[list[str]],
                 evidence: dict[str, list[list[Any]]], title: str = "") -> alt.Chart:
    """Layer x head cells coloured by normalised entropy, each marked with its verdict; a NaN
    head is a cell of the NaN colour labelled NaN."""
    rows = []
    for layer, (values, marks) in enumerate(zip(normalized, verdicts)):
        for h, (value, verdict) in enumerate(zip(values, marks)):
            row = {"layer": layer, "head": h, "normalised entropy": _finite(value), "verdict": verdict}
            row.update({k: _finite(v[layer][h]) for k, v in evidence.items()
                        if isinstance(v, list) and len(v) > layer and len(v[layer]) > h})
            row.update(_nan_flag(value))
            row["text"] = verdict if not row[NAN] else f"NaN\n{verdict}"
            rows.append(row)
    data = pd.DataFrame(rows)
    base = alt.Chart(data, title=title).encode(
        x=alt.X("head:O", title="head"), y=alt.Y("layer:O", title="layer"))
    cells = base.mark_rect(stroke="white").encode(
        color=alt.Color("normalised entropy:Q", scale=ENTROPY_SCALE,
                        legend=alt.Legend(title="normalised entropy: 0 one-hot, 1 uniform",
                                          orient="bottom", gradientLength=220, titleLimit=400)),
        tooltip=tooltips(c for c in data.columns if c not in (NAN, "text")))
    text = base.mark_text(fontSize=11, lineBreak="\n").encode(
        text="text:N",
        color=alt.condition("datum['normalised entropy'] > 0.5", alt.value("black"), alt.value("white")))
    return _with_nan(cells, base, data, text).properties(
        width=max(320, 90 * len(normalized[0])), height=44 * len(normalized))


def difference_grid(a: list[list[float]], b: list[list[float]], title: str) -> alt.Chart:
    """B - A per head, its value written in each cell (white on a dark one); a head that is NaN on
    either side is a NaN cell."""
    rows = []
    for l, (ra, rb) in enumerate(zip(a, b)):
        for h, (x, y) in enumerate(zip(ra, rb)):
            d = y - x if _ok(x) and _ok(y) else math.nan
            rows.append({"layer": l, "head": h, "difference": _finite(d), **_nan_flag(d),
                         "text": f"{d:+.2f}" if _ok(d) else "NaN", "dark": not _ok(d) or abs(d) > DARK_AT})
    data = pd.DataFrame(rows)
    base = alt.Chart(data, title=title).encode(x="head:O", y="layer:O")
    cells = base.mark_rect(stroke="white").encode(
        color=alt.Color("difference:Q", scale=alt.Scale(scheme="redblue", domain=[-1, 1]),
                        legend=alt.Legend(orient="bottom")),
        tooltip=tooltips(["layer", "head", alt.Tooltip("difference:Q", format="+.3f")]))
    text = base.mark_text(fontSize=11).encode(text="text:N", color=INK)
    return _with_nan(cells, base, data, text).properties(width=max(320, 90 * len(a[0])), height=44 * len(a))


def row_entropy_line(values: list[float], labels: list[str]) -> alt.Chart:
    data = pd.DataFrame({"position": list(range(len(values))), "token": labels,
                         "entropy (nats)": [_finite(v) for v in values],
                         "uniform": [math.log(i + 1) for i in range(len(values))]})
    line = alt.Chart(data).mark_line(point=True).encode(
        x=alt.X("position:Q"), y=alt.Y("entropy (nats):Q"), tooltip=tooltips(["position", "token", "entropy (nats)"]))
    uniform = alt.Chart(data).mark_line(strokeDash=[4, 4], color="gray").encode(
        x="position:Q", y="uniform:Q", tooltip=[alt.Tooltip("uniform:Q", title="ln(keys): uniform", format=".3f")])
    return (line + uniform).properties(height=180, title="entropy of each query row (dashed: uniform)")


def step_axis(domain: list[float] | None = None) -> alt.X:
    """The x axis of every over-steps chart: whole steps only (no 2.5 between steps 2 and 3);
    `domain` (`app.axes.x_range`) fixes the range, the same for every chart of a figure."""
    return alt.X("step:Q", title="step", axis=alt.Axis(format="d", tickMinStep=1), scale=x_scale(domain))


def x_scale(domain: list[float] | None) -> alt.Scale | Any:
    """An x range fixed to `domain` exactly (not rounded out to nice ticks), or Altair's own."""
    return alt.Scale(domain=domain, nice=False) if domain is not None else alt.Undefined


def titled(title: str, note: str = "") -> alt.TitleParams | str:
    """A chart title, with `note` (what `app.axes.choose_y` chose) as its subtitle."""
    return alt.TitleParams(text=title, subtitle=note, subtitleColor="#555") if note else title


def y_scale(log: bool = False, domain: list[float] | None = None, zero: bool = False) -> alt.Scale:
    """Log, or linear zoomed to the data (from 0 with `zero`); `domain` fixes the range."""
    kwargs: dict[str, Any] = {"type": "log"} if log else {"zero": zero}
    return alt.Scale(**kwargs, **({"domain": domain} if domain is not None else {}))


def lines_over_steps(data: pd.DataFrame, y: str, color: str, title: str | alt.TitleParams, log: bool = False,
                     height: int = 200, y_title: str | None = None,
                     domain: list[float] | None = None, zero: bool = False,
                     x_domain: list[float] | None = None, width: float | None = None,
                     dash: str | None = None) -> alt.Chart:
    """One line per `color` (and `dash`) over steps; `y_title` names the axis (default: the column),
    `domain` fixes the y range (shared axes), `zero` starts it at 0, `x_domain` fixes the steps',
    `width` is the px the chart is drawn at (its legend gets the columns that fit). `dash`: a second
    column drawn as the line's dash pattern, so that 24 heads are 6 colours × 4 dashes, not a
    10-colour palette used twice and more (its legend beside the plot)."""
    chart = alt.Chart(data, title=title).mark_line(point=len(data) < 80, clip=domain is not None).encode(
        x=step_axis(x_domain), y=alt.Y(f"{y}:Q", scale=y_scale(log, domain, zero), title=y_title or y),
        color=alt.Color(f"{color}:N", legend=legend(legend_columns(data[color], width))),
        tooltip=tooltips(data.columns),
    ).properties(height=height)
    if dash is not None:
        chart = chart.encode(strokeDash=alt.StrokeDash(f"{dash}:N", legend=alt.Legend(orient="right", title=None)))
    return chart


def smoothed_over_steps(data: pd.DataFrame, y: str, color: str, title: str | alt.TitleParams, log: bool = False,
                        height: int = 200, y_title: str | None = None,
                        x_domain: list[float] | None = None) -> alt.TopLevelMixin:
    """`lines_over_steps`, and where `data` has a `smoothed` column (the EMA, `app.series.ema`)
    that line in front with the raw values faint behind it, as TensorBoard draws them."""
    if "smoothed" not in data.columns:
        return lines_over_steps(data, y, color, title, log, height, y_title, x_domain=x_domain)
    base = alt.Chart(data, title=title).encode(
        x=step_axis(x_domain), color=alt.Color(f"{color}:N", legend=legend()), tooltip=tooltips(data.columns))
    raw = base.mark_line(opacity=0.25).encode(y=alt.Y(f"{y}:Q", scale=y_scale(log), title=y_title or y))
    smooth = base.mark_line().encode(y=alt.Y("smoothed:Q", scale=y_scale(log), title=y_title or y))
    return alt.layer(raw, smooth).properties(height=height)


def level_rule(value: float, label: str) -> alt.Chart:
    """A dashed horizontal line at `value` (the entropy of uniform attention), its label in the tooltip."""
    return alt.Chart(pd.DataFrame({"level": [value], "what": [label]})).mark_rule(
        strokeDash=[4, 4], color="gray").encode(
        y="level:Q", tooltip=tooltips(["what", alt.Tooltip("level:Q", format=".3f")]))


def nan_marks(steps: list[int], title: str = "NaN") -> alt.Chart:
    """Red rules where values turned non-finite."""
    return alt.Chart(pd.DataFrame({"step": steps, "what": [title] * len(steps)})).mark_rule(
        color="red", strokeWidth=2).encode(x="step:Q", tooltip=tooltips(["step", "what"]))


SEVERITY_COLOURS = {"info": "#4c78a8", "warning": "#f58518", "failed": "#d62728"}


def with_findings(chart: alt.TopLevelMixin, marks: pd.DataFrame) -> alt.TopLevelMixin:
    """`chart` with a dashed vertical rule at each finding's step (columns step, code, severity,
    title), coloured by severity, the finding in its tooltip; `chart` itself when there are none."""
    if marks is None or marks.empty:
        return chart
    severities = list(SEVERITY_COLOURS)
    rules = alt.Chart(drawing_order(marks[["step", "code", "severity", "title"]])).mark_rule(
        strokeWidth=2, strokeDash=[5, 3], opacity=0.8).encode(
        x="step:Q",
        color=alt.Color("severity:N", legend=None,
                        scale=alt.Scale(domain=severities, range=[SEVERITY_COLOURS[s] for s in severities])),
        tooltip=tooltips(["step", "severity", "code", "title"]))
    return alt.layer(chart, rules).resolve_scale(color="independent")


def drawing_order(marks: pd.DataFrame) -> pd.DataFrame:
    """The findings' rules in the order they are drawn: info, then warnings, failures last, so that
    a failure's red rule lies on top of a warning's orange one at the same step."""
    rank = {s: i for i, s in enumerate(SEVERITY_COLOURS)}
    return marks.sort_values("severity", key=lambda c: c.map(rank).fillna(-1), kind="stable")


def band_layer(lo: float = BAND[0], hi: float = BAND[1]) -> alt.Chart:
    """The healthy g/w/u band as a shaded area, with makemore's 1e-3 as a dashed line."""
    band = alt.Chart(pd.DataFrame({"lo": [lo], "hi": [hi]})).mark_rect(opacity=0.12, color="green").encode(
        y=alt.Y("lo:Q", title=None), y2="hi:Q")
    target = alt.Chart(pd.DataFrame({"u": [1e-3]})).mark_rule(strokeDash=[6, 4], color="green").encode(
        y=alt.Y("u:Q", title=None))
    return band + target


MOST_LABELS = 40  # past this many positions an axis prints every k-th label; the tooltip names each
PX_PER_LABEL = 12  # the least room a printed label gets
FIT_PX = 600  # a position grid wider than this stretches to the page instead (the page is ~820 px at 1280)


def position_axis(n: int, size_px: int, title: str) -> alt.Axis:
    """An axis of n positions labelled "pos: token": every label when each gets PX_PER_LABEL and
    there are at most MOST_LABELS, otherwise every k-th (0, k, 2k, ...) with the title saying so
    (the marks' tooltips name every position)."""
    every = max(1, math.ceil(n / MOST_LABELS), math.ceil(PX_PER_LABEL * n / max(size_px, 1)))
    if every == 1:
        return alt.Axis(title=title, labelOverlap=False, labelLimit=80)
    return alt.Axis(title=f"{title} (a label every {every} positions; hover a cell for each)", labelOverlap=False,
                    labelLimit=80, labelExpr=f"parseInt(split(datum.value, ':')[0]) % {every} == 0 ? datum.value : ''")


DARK_AT = 0.6  # past this fraction of a sequential (or either half of a diverging) scale a cell is dark
INK = alt.condition("datum.dark", alt.value("white"), alt.value("black"))  # text readable on its cell


def shade(values: pd.Series, color: str, top: float | None = None) -> list[float]:
    """Where each value sits on lens_grid's colour scale for `color` (up to `top`, else the largest
    value), 0 (lightest) to 1 (darkest)."""
    finite = [v for v in values if _ok(v)]
    if color == "top-1 probability":
        return [v if _ok(v) else 1.0 for v in values]
    top = top or max(finite + [1e-12])
    if color == "rank of the true next token":  # symlog: log1p
        return [math.log1p(v) / math.log1p(top) if _ok(v) else 1.0 for v in values]
    return [v / top if _ok(v) else 1.0 for v in values]


def lens_grid(cells: pd.DataFrame, color: str, title: str, rank_top: int | None = None) -> alt.Chart:
    """Layer x position: the top-1 token as text, coloured by the chosen measure; cells whose
    measure is NaN (column NAN says "NaN") in the NaN colour. Up to FIT_PX wide at its own size;
    more positions than fit make a chart of width "container" (show it stretched: it fits the
    page, every label or every k-th on the axis and each cell's position in its tooltip).
    `rank_top` (the vocabulary's last rank) fixes the rank scale, so two lenses' grids share it."""
    ranks = {"domain": [0, rank_top]} if rank_top else {}
    scales = {"top-1 probability": alt.Scale(scheme="greens", domain=[0, 1]),
              "KL to final (nats)": alt.Scale(scheme="orangered"),
              "rank of the true next token": alt.Scale(scheme="purples", type="symlog", **ranks)}
    n = cells["label"].nunique()
    step = min(38, FIT_PX // n)  # pixels per position at its own size
    stretch = step < 14  # too many positions for FIT_PX: the page's width, ~12 px each at 1280 px
    top = rank_top if color == "rank of the true next token" else None
    cells = cells.assign(dark=[not _ok(v) or t > DARK_AT for v, t in zip(cells[color], shade(cells[color], color, top))])
    base = alt.Chart(cells, title=title).encode(
        x=alt.X("label:N", sort=list(dict.fromkeys(cells["label"])),
                axis=position_axis(n, FIT_PX if stretch else step * n, "position: input token")),
        y=alt.Y("layer:N", sort=list(dict.fromkeys(cells["layer"])), title="layer"))
    rect = base.mark_rect(stroke="white").encode(
        color=alt.Color(f"{color}:Q", scale=scales[color]), tooltip=tooltips(["layer", "label", "top-k", color]))
    fits = step >= 30  # "(NaN)" in a cell; narrower cells leave the NaN colour and legend to say it
    text = base.transform_calculate(shown="datum['top-1'] == '(NaN)' ? '%s' : datum['top-1']"
                                    % ("(NaN)" if fits else "")).mark_text(
        fontSize=12 if stretch else 14, fontWeight="bold").encode(text="shown:N", color=INK)
    return _with_nan(rect, base, cells, text).properties(
        width="container" if stretch else step * n, height=30 * cells["layer"].nunique())


LAYER_LABELS = "layer (embed: after the embeddings; N_post: after block N)"  # the lens's residual points


def per_layer_line(data: pd.DataFrame, y: str, color: str, title: str) -> alt.Chart:
    """A measure per layer (embed, 0_post, 1_post, ...) in the model's order, one line per `color`;
    a NaN value is a cross labelled NaN on the chart's floor in its line's colour (a run whose
    values are all NaN still shows, where its legend entry says it is)."""
    order = list(dict.fromkeys(data["layer"]))
    missing = data[y].isna()
    frame = data.assign(**{NAN: ["NaN" if m else "" for m in missing]}) if missing.any() else data
    base = alt.Chart(frame).encode(
        x=alt.X("layer:N", sort=order, title=LAYER_LABELS),
        color=alt.Color(f"{color}:N", legend=alt.Legend(orient="bottom", title=None, labelLimit=0)))
    # all NaN: no extent to scale to (Vega's "Infinite extent", one tick at 0); a plain 0..1 floor for the crosses
    scale = alt.Scale(domain=[0, 1]) if missing.all() else alt.Undefined
    line = base.mark_line(point=True).encode(y=alt.Y(f"{y}:Q", title=y, scale=scale), tooltip=tooltips(data.columns))
    if not missing.any():
        return line.properties(title=title, height=220)
    nan = base.transform_filter(f"datum['{NAN}'] == 'NaN'")
    crosses = nan.mark_point(shape="cross", size=90, filled=True, yOffset=-6).encode(
        y=alt.value(220), tooltip=[alt.Tooltip(f"{color}:N"), alt.Tooltip("layer:N"),
                                   alt.Tooltip(f"{NAN}:N", title=y)])
    labels = nan.mark_text(fontSize=10, dy=-18).encode(y=alt.value(220), text=f"{NAN}:N")
    return alt.layer(line, crosses, labels).properties(title=title, height=220)


MAP_SIZE = (500, 440)  # the embedding map's plot, in pixels (fits the page's right column at 1280 px): `app.labels` places its labels for this size


def scatter_map(data: pd.DataFrame, title: str) -> alt.Chart:
    """Points on the first two principal axes, coloured by role; labels where `data["side"]` says
    ("right", "left" or None: `app.labels.place`, which keeps them apart and inside the plot)."""
    from app.labels import GAP_PX, padded_domain

    width, height = MAP_SIZE
    base = alt.Chart(data, title=title).encode(
        x=alt.X("x:Q", title="PC 1", scale=alt.Scale(domain=list(padded_domain(data["x"])), nice=False)),
        y=alt.Y("y:Q", title="PC 2", scale=alt.Scale(domain=list(padded_domain(data["y"])), nice=False)),
        tooltip=tooltips(["token", "id", "role", "cosine"]))
    points = base.mark_circle(size=60).encode(
        color=alt.Color("role:N", scale=alt.Scale(domain=["chosen", "neighbour", "other"],
                                                  range=["#d62728", "#ff7f0e", "#9aa5b1"]),
                        legend=alt.Legend(orient="bottom")))  # beside the 500 px map it was cut off
    right = base.mark_text(dx=GAP_PX, align="left", baseline="middle", fontSize=11, clip=True).encode(
        text="token:N").transform_filter("datum.side == 'right'")
    left = base.mark_text(dx=-GAP_PX, align="right", baseline="middle", fontSize=11, clip=True).encode(
        text="token:N").transform_filter("datum.side == 'left'")
    return (points + right + left).properties(width=width, height=height).interactive()


NAN = "NaN"  # the column that says "NaN" in a non-finite cell ("" elsewhere)
NAN_COLOUR = "#e6007e"  # magenta: outside every scale the grids use


def _nan_flag(value: Any) -> dict[str, str]:
    return {NAN: "" if _ok(value) else "NaN"}


def _with_nan(cells: alt.Chart, base: alt.Chart, data: pd.DataFrame, text: alt.Chart) -> alt.LayerChart:
    """`cells` + `text`, with the cells whose NAN column says "NaN" drawn in the NaN colour and a
    legend entry "NaN" between them (the value layer drops nulls: they would be blank)."""
    if NAN not in data or not (data[NAN] == "NaN").any():
        return alt.layer(cells, text)
    nan = base.transform_filter(f"datum['{NAN}'] == 'NaN'").mark_rect(stroke="white").encode(
        color=alt.Color(f"{NAN}:N", scale=alt.Scale(domain=["NaN"], range=[NAN_COLOUR]),
                        legend=alt.Legend(orient="bottom", title=None)),
        tooltip=tooltips(c for c in data.columns if c not in ("text", "dark")))
    return alt.layer(cells, nan, text).resolve_scale(color="independent")


def _ok(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _finite(value: Any) -> Any:
    return value if not isinstance(value, float) or math.isfinite(value) else None


# ---------------------------------------------------------------- head types and attribution (issue 21)

def head_types_grid(scores: dict[str, list[list[float]]], shown: str, title: str = "") -> alt.Chart:
    """Layer x head cells coloured by the chosen head-type score (0..1), its value written in each;
    the tooltip carries every type's score; a NaN head is a cell of the NaN colour labelled NaN, as
    on the entropy grid (it was a '-' on an empty cell)."""
    rows = []
    for layer, values in enumerate(scores[shown]):
        for h, value in enumerate(values):
            row = {"layer": layer, "head": h, "score": _finite(value), **_nan_flag(value),
                   "text": f"{value:.2f}" if _ok(value) else "NaN"}
            row.update({name: _finite(grid[layer][h]) for name, grid in scores.items()})
            rows.append(row)
    data = pd.DataFrame(rows)
    base = alt.Chart(data, title=title).encode(x=alt.X("head:O", title="head"), y=alt.Y("layer:O", title="layer"))
    cells = base.mark_rect(stroke="white").encode(
        color=alt.Color("score:Q", scale=alt.Scale(scheme="blues", domain=[0, 1]),
                        legend=alt.Legend(title=f"{shown} score", orient="bottom", gradientLength=220)),
        tooltip=tooltips(["layer", "head", *scores]))
    text = base.mark_text(fontSize=11).encode(
        text="text:N", color=alt.condition(f"datum.score > 0.5 || datum['{NAN}'] == 'NaN'",
                                           alt.value("white"), alt.value("black")))
    return _with_nan(cells, base, data, text).properties(
        width=max(240, 60 * len(scores[shown][0])), height=44 * len(scores[shown]))


def attribution_colour(bound: float) -> alt.Color:
    """The one colour scale of direct attribution, on the bars and the heatmap alike: diverging,
    red below 0, white at 0, blue above, symmetric to +-bound (the largest |value| of both charts)."""
    return alt.Color("attribution:Q", scale=alt.Scale(scheme="redblue", domain=[-bound, bound], domainMid=0),
                     legend=alt.Legend(orient="bottom", title="direct attribution (red -, blue +)",
                                       gradientLength=220))


def attribution_bound(*values: list[float]) -> float:
    """The largest finite |value| among the lists given (a tiny number for none)."""
    return max([abs(v) for vs in values for v in vs if _ok(v)] + [1e-9])


def attribution_bars(labels: list[str], values: list[float], title: str, bound: float | None = None) -> alt.Chart:
    """One bar per component (embeddings, heads, MLPs, biases) in the model's order, coloured on
    attribution_colour's scale."""
    data = pd.DataFrame({"component": labels, "attribution": [_finite(v) for v in values]})
    return alt.Chart(data, title=title).mark_bar(stroke="#888", strokeWidth=0.5).encode(
        x=alt.X("component:N", sort=labels, title=None),
        y=alt.Y("attribution:Q", title="direct contribution to the logit"),
        color=attribution_colour(bound or attribution_bound(values)),
        tooltip=tooltips(["component", "attribution"])).properties(height=260)


def attribution_heatmap(heads: list[list[float]], title: str, bound: float | None = None) -> alt.Chart:
    """Layer x head, each head's direct attribution on attribution_colour's scale."""
    bound = bound or attribution_bound(*heads)
    rows = [{"layer": l, "head": h, "attribution": _finite(v), "text": f"{v:.2f}" if _ok(v) else "-",
             "dark": _ok(v) and abs(v) > DARK_AT * bound} for l, row in enumerate(heads) for h, v in enumerate(row)]
    data = pd.DataFrame(rows)
    base = alt.Chart(data, title=title).encode(x=alt.X("head:O"), y=alt.Y("layer:O"))
    cells = base.mark_rect(stroke="white").encode(
        color=attribution_colour(bound),
        tooltip=tooltips(["layer", "head", "attribution"]))
    text = base.mark_text(fontSize=11).encode(text="text:N", color=INK)
    return (cells + text).properties(width=max(240, 60 * len(heads[0])), height=44 * len(heads))
