"""Logit lens: what does each layer already predict?"""

from __future__ import annotations

import json
import math

import pandas as pd
import streamlit as st

from app import charts, data
from app.views import tuned
from app.views.common import Selection, has_attention, page, show

NOT_FINITE = "(NaN)"  # the probe's mark for a position without a top token
MEASURES = ["top-1 probability", "KL to final (nats)", "rank of the true next token"]


@page("Logit lens", "What does each layer already predict?")
def render(sel: Selection) -> None:
    snap = data.snapshot(sel.snapshot, sel.run.preset)
    if not has_attention(snap) or snap.config.unembed == "mlp":
        st.info("Not applicable: the logit lens needs a residual stream read out by an unembedding, and "
                "this model (an MLP-family model, or one whose last MLP maps straight to the vocabulary) "
                "has none. See Overview, Embeddings and Training dynamics instead.")
        return
    measure = st.radio("colour by", MEASURES, horizontal=True, key="lens_measure")
    result = data.lens(*sel.key[:2], sel.text, 5, sel.run.preset)
    cells = lens_cells(result)
    rank_top = snap.tokenizer.vocab_size - 1  # one rank scale for the logit and the tuned lens
    show(charts.lens_grid(with_nan(cells, measure), measure, "top-1 token per layer and position", rank_top))
    nan = [label for label in result["layers"] if (cells[cells["layer"] == label]["top-1"] == NOT_FINITE).any()]
    if nan:
        st.caption(f"{NOT_FINITE}: the layer's distribution holds NaN or inf there (layers {', '.join(nan)}), "
                   "so it has no top token; NaN cells are drawn in their own colour.")
    if all(v is None for v in result["kl_to_final"]):
        st.caption("KL to the final layer is NaN at every layer (crosses on the floor): the final "
                   "layer's distribution is not finite, so there is nothing to measure against.")
    kl = pd.DataFrame({"layer": result["layers"], "KL(final || layer)": result["kl_to_final"],
                       "run": f"{sel.run.label} / {sel.snapshot.name}"})
    show(charts.per_layer_line(kl, "KL(final || layer)", "run", "KL to the final layer, per layer"), stretch=True)
    tuned.render_tuned(sel, result, measure, rank_top)
    _attribution(sel, snap)


def lens_cells(result: dict) -> pd.DataFrame:
    """One row per layer and position: the top-1 token (NOT_FINITE where the layer's top-k is empty or
    its probabilities are NaN: the probe gives either), its probability, KL and rank, the top-k."""
    pieces = result["pieces"][0]
    rows = []
    for l, label in enumerate(result["layers"]):
        for pos, top in enumerate(result["top_k"][l][0]):
            top = [t for t in top if _finite(t["prob"])]  # NaN probabilities rank nothing
            best = top[0] if top else {"piece": NOT_FINITE, "id": None, "prob": None}
            rows.append({"layer": label, "label": f"{pos}: {data.shown(pieces[pos])}",
                         "top-1": data.shown(best["piece"] or str(best["id"])),
                         "top-1 probability": best["prob"],
                         "KL to final (nats)": result["kl_to_final_per_position"][l][0][pos],
                         "rank of the true next token": result["target_rank_per_position"][l][0][pos],
                         "last": pos == len(pieces) - 1,
                         "top-k": json.dumps([(t["piece"], round(t["prob"], 3)) for t in top],
                                             ensure_ascii=False)})
    return pd.DataFrame(rows)


def with_nan(cells: pd.DataFrame, measure: str) -> pd.DataFrame:
    """`cells` with the charts' NaN column: "NaN" where `measure` is missing because a distribution
    is not finite (the last position has no next token to rank: blank there, not NaN)."""
    undefined = cells["last"] & (measure == "rank of the true next token")
    return cells.assign(**{charts.NAN: ["NaN" if v else "" for v in cells[measure].isna() & ~undefined]})


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _attribution(sel: Selection, snap: object) -> None:  # issue 21: the attribution view
    from app.views import attribution
    attribution.render(sel, snap)
