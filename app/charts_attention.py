"""Altair charts of attention patterns (the Attention page): one head's heatmap, every head of a
layer as small multiples (as CircuitsVis' `attention_patterns`), a token view in which hovering a
token shows what it attends to, and the click that picks a head on a layer x head grid.

Pure functions from plain data to a chart, no Streamlit. Attention weights share one colour
scale, white at 0 rising to dark blue at 1, so that a weight of zero is blank paper and two
heads compare at a glance.
"""

from __future__ import annotations

import math

import altair as alt
import pandas as pd

from app.charts import position_axis

WHITE_AT_ZERO = ["#ffffff", "#08306b"]  # attention 0 -> white, 1 -> dark blue
ATTENTION_SCALE = alt.Scale(domain=[0, 1], range=WHITE_AT_ZERO, interpolate="hcl")
FUTURE = "#e8e8e8"  # a key after the query: masked, not a weight of zero
PICK = "pick"  # the point selection on a layer x head grid: a click picks that head


def attention_legend(title: str = "attention weight") -> alt.Legend:
    return alt.Legend(title=title, orient="right", gradientLength=160)


# ---------------------------------------------------------------- picking a head on a grid

def pick_param(fields: list[str] | None = None) -> alt.Parameter:
    """A click selects one cell; Streamlit reports it as {PICK: [{"head": h, "layer": l}]}.
    On a grid the x/y encodings (head, layer) project it; on a faceted chart the fields do."""
    if fields:
        return alt.selection_point(name=PICK, fields=fields, on="click", clear=False)
    return alt.selection_point(name=PICK, encodings=["x", "y"], on="click", clear=False)


def pickable(grid: alt.LayerChart, chosen: tuple[int, int]) -> alt.LayerChart:
    """A layer x head grid (charts.entropy_grid, charts.head_types_grid) whose cells a click
    picks, the chosen head (layer, head) outlined in black."""
    cells = grid.layer[0]
    layer, head = chosen
    outline = alt.Chart(cells.data).transform_filter(
        f"datum.layer == {int(layer)} && datum.head == {int(head)}").mark_rect(
        filled=False, stroke="black", strokeWidth=3).encode(x="head:O", y="layer:O")
    out = grid.copy(deep=False)
    out.layer = [cells.add_params(pick_param()), *grid.layer[1:], outline]
    return out


def picked(event: object) -> tuple[int, int] | None:
    """(layer, head) of the cell a click picked, from Streamlit's selection state; None for none."""
    try:
        points = event["selection"][PICK]  # type: ignore[index]
    except (KeyError, TypeError):
        return None
    if not points:
        return None
    point = points[0]
    return int(point["layer"]), int(point["head"])


# ---------------------------------------------------------------- one head

def heatmap_size(n: int) -> int:
    return max(240, min(600, 16 * n))  # with its labels and legend, inside the ~820 px page


def pattern_heatmap(pattern: list[list[float]], labels: list[str], pieces: list[str], title: str) -> alt.Chart:
    """A head's attention [q k]: query rows against key columns, "pos: token" on both axes (or
    every k-th past charts.MOST_LABELS, each in the tooltip), white where the weight is 0."""
    rows = [{"query": labels[q], "key": labels[k], "q": q, "k": k, "p": p,
             "query token": repr(pieces[q]), "key token": repr(pieces[k])}
            for q, row in enumerate(pattern) for k, p in enumerate(row) if k <= q]
    size = heatmap_size(len(labels))
    return alt.Chart(pd.DataFrame(rows), title=title).mark_rect().encode(
        x=alt.X("key:N", sort=labels, axis=position_axis(len(labels), size, "key (position: token)")),
        y=alt.Y("query:N", sort=labels, axis=position_axis(len(labels), size, "query (position: token)")),
        color=alt.Color("p:Q", scale=ATTENTION_SCALE, legend=attention_legend()),
        tooltip=["query", "key", "query token", "key token", alt.Tooltip("p:Q", title="weight", format=".3f")],
    ).properties(width=size, height=size)


# ---------------------------------------------------------------- every head of a layer

def layer_multiples(patterns: list[list[list[float]]], labels: list[str], verdicts: list[str],
                    layer: int, columns: int = 4, size: int = 150) -> alt.Chart:
    """patterns [head q k] of one layer as a grid of small heatmaps titled "L{layer}H{h}: verdict";
    positions in the tooltip; a click on a heatmap picks that head (PICK, fields layer and head)."""
    titles = [f"L{layer}H{h}: {verdict}" for h, verdict in enumerate(verdicts)]
    rows = [{"layer": layer, "head": h, "title": titles[h], "q": q, "k": k, "p": p,
             "query": labels[q], "key": labels[k]}
            for h, pattern in enumerate(patterns) for q, row in enumerate(pattern)
            for k, p in enumerate(row) if k <= q]
    return alt.Chart(pd.DataFrame(rows)).mark_rect().encode(
        x=alt.X("k:O", axis=None), y=alt.Y("q:O", axis=None),
        color=alt.Color("p:Q", scale=ATTENTION_SCALE, legend=attention_legend()),
        tooltip=["title", "query", "key", alt.Tooltip("p:Q", title="weight", format=".3f")],
        facet=alt.Facet("title:N", sort=titles, columns=min(columns, len(titles)),
                        header=alt.Header(title=None, labelFontSize=12, labelFontWeight="bold")),
    ).add_params(pick_param(["layer", "head"])).properties(
        width=size, height=size, title=f"every head of layer {layer} (click one to pick it)")


# ---------------------------------------------------------------- what a token attends to

def token_view(pattern: list[list[float]], pieces: list[str], query: int, title: str,
               per_line: int = 16) -> alt.LayerChart:
    """The text as boxes, `per_line` tokens a line; hovering a token (or the chosen `query`, at
    first) fills every earlier token with the weight it puts there (later tokens are grey:
    masked). pattern [q k]; pieces are the shown tokens."""
    n = len(pieces)
    rows = [{"q": q, "k": k, "p": pattern[q][k] if k <= q else None, "future": k > q,
             "line": k // per_line, "column": k % per_line, "token": pieces[k], "label": f"{k}: {pieces[k]}",
             "weight": f"{pattern[q][k]:.2f}" if k <= q and pattern[q][k] >= 0.005 else ""}
            for q in range(n) for k in range(n)]
    hover = alt.selection_point(name="hover", fields=["q"], on="pointerover", clear=False,
                                value=[{"q": int(query)}])
    base = alt.Chart(pd.DataFrame(rows)).encode(
        x=alt.X("column:O", axis=None), y=alt.Y("line:O", axis=None))
    fill = base.transform_filter(hover).transform_filter("!datum.future").mark_rect().encode(
        color=alt.Color("p:Q", scale=ATTENTION_SCALE, legend=attention_legend("weight from the hovered token")))
    future = base.transform_filter(hover).transform_filter("datum.future").mark_rect(color=FUTURE)
    under = alt.condition("datum.p > 0.6", alt.value("white"), alt.value("black"))  # on the hovered row's fill
    words = base.transform_filter(hover).mark_text(dy=-5, fontSize=13, limit=34).encode(text="token:N", color=under)
    weights = base.transform_filter(hover).mark_text(dy=11, fontSize=9).encode(text="weight:N", color=under)
    boxes = base.transform_filter("datum.q == datum.k").mark_rect(fill="transparent").encode(  # one a token, on top
        stroke=alt.condition(hover, alt.value("black"), alt.value("#c8c8c8")),
        strokeWidth=alt.condition(hover, alt.value(3), alt.value(1)),
        tooltip=[alt.Tooltip("label:N", title="position: token")]).add_params(hover)
    lines = math.ceil(n / per_line)
    return alt.layer(fill, future, words, weights, boxes, title=title).properties(  # n^2 rows, ~5n marks: SVG
        width=36 * min(n, per_line), height=42 * lines, usermeta={"embedOptions": {"renderer": "svg"}})
