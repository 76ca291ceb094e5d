"""Embeddings: which tokens does the model treat alike?"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import charts, data
from app.views.common import Selection, page, show

TABLES = {"input": "input embedding", "output": "unembedding", "cross": "input → output"}


@page("Embeddings", "Which tokens does the model treat alike?")
def render(sel: Selection) -> None:
    snap = data.snapshot(sel.snapshot, sel.run.preset)
    c1, c2, c3 = st.columns(3)
    token = c1.text_input("token", value="e", key="token")
    has_output = getattr(snap.config, "family", "") == "transformer" and snap.config.unembed != "mlp"
    tables = list(TABLES) if has_output else ["input"]
    table = c2.selectbox("table", tables, format_func=TABLES.get, key="table")
    k = c3.slider("neighbours", 3, 30, 10, key="k")
    result = data.nearest(*sel.key[:2], token, k, table, sel.run.preset)
    rows = [{"token": data.shown(n["piece"] or str(n["id"])), "id": n["id"], "cosine": round(n["cosine"], 4)}
            for n in result["neighbours"]]
    left, right = st.columns([1, 2])
    left.dataframe(pd.DataFrame(rows), width="stretch", hide_index=True)
    if "self_cosine" in result:
        left.caption(f"cosine of the token's own input and output vectors: {result['self_cosine']:.3f}")
    projected = data.embedding_map(*sel.key[:2], "output" if table == "output" else "input", sel.run.preset)
    chosen = result["query"].get("id") if isinstance(result.get("query"), dict) else None
    near = {n["id"]: n["cosine"] for n in result["neighbours"]}
    frame = pd.DataFrame({"x": projected["x"], "y": projected["y"],
                          "token": [data.shown(p) for p in projected["pieces"]],
                          "id": list(range(len(projected["x"])))})
    frame["role"] = ["chosen" if i == chosen else "neighbour" if i in near else "other" for i in frame["id"]]
    frame["cosine"] = [near.get(i) for i in frame["id"]]
    explained = projected["explained"]
    show(charts.scatter_map(frame, f"PCA of the {TABLES.get(table, table)} table "
                                                 f"({explained[0]:.0%} + {explained[1]:.0%} of the variance)"), right, stretch=True)
