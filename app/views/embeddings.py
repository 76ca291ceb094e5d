"""Embeddings: which tokens does the model treat alike?"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from app import charts, data, labels
from app.views.common import Selection, page, show
from probes.first_view import PAGE_K, PAGE_TOKEN

TABLES = {"input": "input embedding", "output": "unembedding", "cross": "input → output"}
LOW_VARIANCE = 0.2  # under this share of the variance, the 2-D map is said to show little


@page("Embeddings", "Which tokens does the model treat alike?")
def render(sel: Selection) -> None:
    snap = data.opening(sel.snapshot, sel.run.preset)  # no model yet: its config (the first view needs none)
    c1, c2, c3 = st.columns(3)
    token = c1.text_input("token", value=PAGE_TOKEN, key="token")
    has_output = getattr(snap.config, "family", "") == "transformer" and snap.config.unembed != "mlp"
    tables = list(TABLES) if has_output else ["input"]
    if st.session_state.get("table") not in tables:  # first visit: open on a table that shows something
        st.session_state["table"] = opening_table(sel, tables, st.session_state.get("k", PAGE_K))
    table = c2.selectbox("table", tables, format_func=TABLES.get, key="table")
    k = c3.slider("neighbours", 3, 30, PAGE_K, key="k")
    result = data.nearest(*sel.key[:2], token, k, table, sel.run.preset)
    left, right = st.columns([1, 2])
    # the map first, then the table beside it: a page's first table makes the browser fetch and start
    # the data grid's code, which held the map back (the first chart came 2.2-2.6x a bare page's)
    draw_map(sel, table, result, right)
    rows = [{"token": data.shown(n["piece"] or str(n["id"])), "id": n["id"], "cosine": round(n["cosine"], 4)}
            for n in result["neighbours"]]
    left.dataframe(pd.DataFrame(rows), width="stretch", hide_index=True)
    if "self_cosine" in result:
        left.caption(f"cosine of the token's own input and output vectors: {result['self_cosine']:.3f}")
    baseline_note(result, data.neighbour_baseline(*sel.key[:2], table, k, sel.run.preset), left, has_output)


def draw_map(sel: Selection, table: str, result: dict, where) -> None:
    """The table's 2-D map with the chosen token and its neighbours (`result`) highlighted and labelled."""
    projected = data.embedding_map(*sel.key[:2], "output" if table == "output" else "input", sel.run.preset)
    chosen = result["query"].get("id") if isinstance(result.get("query"), dict) else None
    near = {n["id"]: n["cosine"] for n in result["neighbours"]}
    frame = pd.DataFrame({"x": projected["x"], "y": projected["y"],
                          "token": [data.shown(p) for p in projected["pieces"]],
                          "id": list(range(len(projected["x"])))})
    frame["role"] = ["chosen" if i == chosen else "neighbour" if i in near else "other" for i in frame["id"]]
    frame["cosine"] = [near.get(i) for i in frame["id"]]
    order = ([chosen] if chosen is not None and chosen < len(frame) else []) + \
        sorted((i for i in near if i < len(frame)), key=lambda i: -near[i]) + \
        [i for i in frame["id"] if i != chosen and i not in near]
    frame["side"] = labels.place(frame["x"], frame["y"], frame["token"], order, *charts.MAP_SIZE)
    explained = projected["explained"]
    name = TABLES.get(table, table) if table != "cross" else TABLES["input"]
    show(charts.scatter_map(frame, f"PCA of the {name} table "
                                   f"({explained[0]:.0%} + {explained[1]:.0%} of the variance)"), where)
    pca_note(explained, frame, where)

def opening_table(sel: Selection, tables: list[str], k: int) -> str:
    """The first of `tables` with more structure than its dimension-shuffled copies: the series'
    input tables barely move from their random init, so opening on one showed only "no more
    structure than chance" while the unembedding beside it had neighbours worth reading."""
    for table in tables:
        if data.neighbour_baseline(*sel.key[:2], table, k, sel.run.preset).structured:
            return table
    return tables[0]


def baseline_note(result: dict, base: Any, where, has_output: bool) -> None:
    """The neighbours against the same table with its dimensions shuffled (`probes.neighbour_baseline`):
    a warning where the table holds no more structure than that (an untrained table), a caption
    saying what was compared otherwise."""
    if not result["neighbours"]:
        return
    token = result["mean_cosine"]
    compared = (f"a token's mean cosine to its {base.k} nearest: in this table {base.table_median:.2f} for the "
                f"median token; with each dimension shuffled across tokens ({base.seeds} shuffles), "
                f"{base.shuffled_median:.2f}, and {base.level:.0%} of tokens below {base.shuffled_level:.2f}")
    if not base.structured:
        other = " (another table may show more)" if has_output else ""
        where.warning(f"No more structure than chance: {compared}. A random, untrained table looks like this; "
                      f"these neighbours say little{other}.")
        return
    mine = f"this token: {token:.2f}"
    if not base.token_above(token):
        mine += ", no closer than a shuffled table's tokens: read its neighbours with care"
    where.caption(f"Compared with chance: {compared}; {mine}.")


def pca_note(explained: list[float], frame: pd.DataFrame, where) -> None:
    shown = sum(explained[:2])
    if shown < LOW_VARIANCE:
        where.warning(f"The two components explain only {shown:.0%} of the variance: tokens close on this "
                      "map need not be close in the table (trust the neighbour table).")
    hidden = int(frame["side"].isna().sum())
    if hidden:
        where.caption(f"{hidden} of {len(frame)} labels left off where they would overlap or cross the edge "
                      "(hover a point for its token; zoom with the mouse wheel).")


# the page: Streamlit runs this file afresh as `__main__` on each load (app/shell.py's navigation); it
# draws with the imported module, so that every load shares one copy of it; an import draws nothing
if __name__ == "__main__":
    from app.views import embeddings
    from app.views.common import current

    embeddings.render(current())  # app/main.py put the sidebar's selection in session state
