"""Attention: which heads collapsed, went uniform, or sink, and what does one head look at?"""

from __future__ import annotations

from typing import Any

import streamlit as st

from app import charts, data
from app.views.common import Selection, has_attention, page, show

FEW_ROWS = 16  # below this the attention-sink score is not meaningful (uniform rows score high)


@page("Attention", "Which heads collapsed, went uniform or became sinks, and what does one head look at?")
def render(sel: Selection) -> None:
    snap = data.snapshot(sel.snapshot, sel.run.preset)
    if not has_attention(snap):
        st.info("Not applicable: this model has no attention heads (an MLP-family model). See Overview, "
                "Embeddings and Training dynamics instead.")
        return
    result = data.attention(*sel.key[:2], sel.text, sel.run.preset)
    if result["rows"] < FEW_ROWS:
        st.warning(f"Only {result['rows']} positions: the sink score (mass on the first position) is not "
                   "meaningful on so short a context; give a longer text.")
    evidence = {k: v for k, v in result["evidence"].items() if isinstance(v, list)}
    left, right = st.columns(2)
    show(charts.entropy_grid(result["normalized"], result["verdicts"], evidence,
                                        "normalised entropy and verdict per head"), left)
    head_types(sel, right)
    cfg = snap.config
    c1, c2 = st.columns(2)
    layer = c1.selectbox("layer", list(range(cfg.n_layers)), key="layer")
    head = c2.selectbox("head", list(range(cfg.n_heads)), key="head")
    st.markdown(f"**L{layer}H{head}: `{result['verdicts'][layer][head]}`**, entropy "
                f"{result['entropy'][layer][head]:.3f} nats, normalised {result['normalized'][layer][head]:.3f}")
    detail = data.head(*sel.key[:2], sel.text, layer, head, sel.run.preset)
    labels = [f"{i}: {data.shown(p)}" for i, p in enumerate(detail["pieces"])]
    show(charts.pattern_heatmap(detail["pattern"], labels, detail["pieces"],
                                           f"L{layer}H{head} attention pattern"))
    show(charts.row_entropy_line(detail["row_entropy"], labels), stretch=True)


HEAD_TYPES = {"previous token": "previous_token", "induction": "induction", "induction (random repeat)":
              "induction_repeat", "duplicate token": "duplicate_token", "sink (first position)": "sink",
              "copying (OV, -1..1)": "copying"}


def head_types(sel: Selection, where: Any) -> None:
    """The head-type grid (probes.heads) beside the entropy grid."""
    types = data.head_types(*sel.key[:2], sel.text, sel.run.preset)
    choices = [label for label, name in HEAD_TYPES.items() if name in types["scores"]]
    label = where.radio("head type", choices, horizontal=True, key="head_type")
    title = f"{label} score per head" + (f" (period {types['repeat_length']})" if "repeat" in label else "")
    show(charts.head_types_grid(types["scores"], HEAD_TYPES[label], title), where)
