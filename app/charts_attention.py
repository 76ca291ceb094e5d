"""Altair charts of attention patterns (the Attention page): one head's heatmap, every head of a
layer as small multiples (as CircuitsVis' `attention_patterns`), a token view in which hovering a
token shows what it attends to, and the click that picks a head on a layer x head grid.

Pure functions from plain data to a chart, no Streamlit. Attention weights share one colour
scale, white at 0 rising to dark blue at 1, so that a weight of zero is blank paper and two
heads compare at a glance.
"""

from __future__ import annotations

import json
import math

import altair as alt
import pandas as pd

from app.charts import position_axis, tooltips

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
        tooltip=tooltips(["query", "key", "query token", "key token",
                          alt.Tooltip("p:Q", title="weight", format=".3f")]),
    ).properties(width=size, height=size)


# ---------------------------------------------------------------- every head of a layer

def layer_multiples(patterns: list[list[list[float]]], labels: list[str], verdicts: list[str],
                    layer: int, columns: int = 4, size: int = 150) -> alt.Chart:
    """patterns [head q k] of one layer as a grid of small heatmaps titled "L{layer}H{h}: verdict";
    a click on a heatmap picks that head (PICK, fields layer and head)."""
    titles = [f"L{layer}H{h}: {verdict}" for h, verdict in enumerate(verdicts)]
    n = len(labels)
    q, k = zip(*[(q, k) for q in range(n) for k in range(q + 1)])
    cells = pd.DataFrame({"layer": layer, "head": [h for h in range(len(patterns)) for _ in q],
                          "q": list(q) * len(patterns), "k": list(k) * len(patterns),
                          "p": [p[a][b] for p in patterns for a, b in zip(q, k)]})
    return alt.Chart(cells).mark_rect().encode(
        x=alt.X("k:O", axis=None), y=alt.Y("q:O", axis=None),
        color=alt.Color("p:Q", scale=ATTENTION_SCALE, legend=attention_legend()),
        facet=alt.Facet("head:O", columns=min(columns, len(titles)),
                        header=alt.Header(title=None, labelFontSize=12, labelFontWeight="bold",
                                          labelExpr=f"{json.dumps(titles)}[datum.value]")),
    ).add_params(pick_param(["layer", "head"])).properties(
        width=size, height=size, title=f"every head of layer {layer} (click one to pick it)")


# ---------------------------------------------------------------- what a token attends to

def token_view(pattern: list[list[float]], pieces: list[str], query: int, title: str,
               per_line: int = 16) -> alt.LayerChart:
    """The text as boxes, `per_line` tokens a line; hovering a token (or the chosen `query`, at
    first) fills every earlier token with the weight it puts there (later tokens are grey:
    masked). pattern [q k]; pieces are the shown tokens.

    Two datasets keep the browser's work small: `tokens` (n rows: the boxes to hover, the words)
    and `weights` (n^2 rows, numbers only: one row per query and key, p empty where masked); only
    the hovered query's n rows of `weights` are drawn, and only they look up their word."""
    n = len(pieces)
    tokens = pd.DataFrame({"q": range(n), "k": range(n), "line": [k // per_line for k in range(n)],
                           "column": [k % per_line for k in range(n)], "token": pieces,
                           "label": [f"{k}: {piece}" for k, piece in enumerate(pieces)]})
    weights = pd.DataFrame({"q": [q for q in range(n) for _ in range(n)], "k": list(range(n)) * n,
                            "p": [pattern[q][k] if k <= q else None for q in range(n) for k in range(n)]})
    weights["line"], weights["column"] = weights["k"] // per_line, weights["k"] % per_line
    hover = alt.selection_point(name="hover", fields=["q"], on="pointerover", clear=False,
                                value=[{"q": int(query)}])
    place = {"x": alt.X("column:O", axis=None), "y": alt.Y("line:O", axis=None)}
    hovered = alt.Chart(weights).transform_filter(hover).encode(**place)  # the hovered query's n rows
    fill = hovered.transform_filter("datum.k <= datum.q").mark_rect().encode(
        color=alt.Color("p:Q", scale=ATTENTION_SCALE, legend=attention_legend("weight from the hovered token")))
    future = hovered.transform_filter("datum.k > datum.q").mark_rect(color=FUTURE)
    under = alt.condition("datum.p > 0.6", alt.value("white"), alt.value("black"))  # on the hovered row's fill
    words = hovered.transform_lookup(lookup="k", from_=alt.LookupData(tokens, "k", ["token"])).mark_text(
        dy=-5, fontSize=13, limit=34).encode(text="token:N", color=under)
    shown = hovered.transform_filter("datum.k <= datum.q && datum.p >= 0.005").mark_text(dy=11, fontSize=9).encode(
        text=alt.Text("p:Q", format=".2f"), color=under)
    boxes = alt.Chart(tokens).mark_rect(fill="transparent").encode(  # one a token, on top
        **place, stroke=alt.condition(hover, alt.value("black"), alt.value("#c8c8c8")),
        strokeWidth=alt.condition(hover, alt.value(3), alt.value(1)),
        tooltip=[alt.Tooltip("label:N", title="position: token")]).add_params(hover)
    lines = math.ceil(n / per_line)
    return alt.layer(fill, future, words, shown, boxes, title=title).properties(  # ~5n marks: SVG
        width=36 * min(n, per_line), height=42 * lines, usermeta={"embedOptions": {"renderer": "svg"}})
