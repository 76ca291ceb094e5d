"""Logit lens: what does each layer already predict?"""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from app import charts, data
from app.views.common import Selection, has_attention, page, show

MEASURES = ["top-1 probability", "KL to final (nats)", "rank of the true next token"]


@page("Logit lens", "What does each layer already predict?")
def render(sel: Selection) -> None:
    snap = data.snapshot(sel.snapshot, sel.run.preset)
    if not has_attention(snap) or snap.config.unembed == "mlp":
        st.error("The logit lens needs a residual stream read out by an unembedding: this model "
                 "(an MLP-family model, or one whose last MLP maps straight to the vocabulary) has none.")
        return
    measure = st.radio("colour by", MEASURES, horizontal=True, key="lens_measure")
    result = data.lens(*sel.key[:2], sel.text, 5, sel.run.preset)
    show(charts.lens_grid(lens_cells(result), measure, "top-1 token per layer and position"))
    kl = pd.DataFrame({"layer": result["layers"], "KL(final || layer)": result["kl_to_final"], "run": "this"})
    show(charts.per_layer_line(kl, "KL(final || layer)", "run", "KL to the final layer, per layer"), stretch=True)
    _attribution(sel, snap)


def lens_cells(result: dict) -> pd.DataFrame:
    pieces = result["pieces"][0]
    rows = []
    for l, label in enumerate(result["layers"]):
        for pos, top in enumerate(result["top_k"][l][0]):
            rows.append({"layer": label, "label": f"{pos}: {data.shown(pieces[pos])}",
                         "top-1": data.shown(top[0]["piece"] or str(top[0]["id"])),
                         "top-1 probability": top[0]["prob"],
                         "KL to final (nats)": result["kl_to_final_per_position"][l][0][pos],
                         "rank of the true next token": result["target_rank_per_position"][l][0][pos],
                         "top-k": json.dumps([(t["piece"], round(t["prob"], 3)) for t in top],
                                             ensure_ascii=False)})
    return pd.DataFrame(rows)


def _attribution(sel: Selection, snap: object) -> None:  # issue 21: the attribution view
    from app.views import attribution
    attribution.render(sel, snap)
