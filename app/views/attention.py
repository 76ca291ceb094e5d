"""Attention: which heads collapsed, went uniform, or sink, and what does one head look at?"""

from __future__ import annotations

import functools
from typing import Any

import streamlit as st

from app import charts, charts_attention, data, warm
from app.views.common import Selection, has_attention, page, saved_note, show

FEW_ROWS = 16  # below this the attention-sink score is not meaningful (uniform rows score high)


@page("Attention", "Which heads collapsed, went uniform or became sinks, and what does one head look at?")
def render(sel: Selection) -> None:
    snap = data.opening(sel.snapshot, sel.run.preset)  # no model yet: its config and tokenizer
    if not has_attention(snap):
        st.info("Not applicable: this model has no attention heads (an MLP-family model). See Overview, "
                "Embeddings and Training dynamics instead.")
        return
    saved_note(snap)
    result = data.attention(*sel.key[:2], sel.text, sel.run.preset)
    if result["rows"] < FEW_ROWS:
        st.warning(f"Only {result['rows']} positions: the sink score (mass on the first position) is not "
                   "meaningful on so short a context; give a longer text.")
    cfg = snap.config
    grids = st.container()  # drawn above the layer/head boxes, once their values are known
    c1, c2 = st.columns(2)
    layer = c1.selectbox("layer", list(range(cfg.n_layers)), key="layer")
    head = c2.selectbox("head", list(range(cfg.n_heads)), key="head")
    one_head, every_head, tokens = st.container(), st.container(), st.container()
    # saved beside the snapshot (the first view), the grids come first, before the model loads for the
    # heads' patterns; read from the model, the charts the browser takes longest to draw (the small
    # multiples, the token view) are sent first, into their places below: the browser draws them
    # while the grids above are built
    first = data.has_saved(sel, "attention", "head_types")
    if first:
        draw_grids(sel, result, grids, (layer, head))
        warm.before_first_model()
    detail = data.head(*sel.key[:2], sel.text, layer, head, sel.run.preset)
    labels = [f"{i}: {data.shown(p)}" for i, p in enumerate(detail["pieces"])]
    every = data.layer_patterns(*sel.key[:2], sel.text, layer, sel.run.preset)
    pick(charts_attention.layer_multiples(every["patterns"], labels, result["verdicts"][layer], layer),
         "multiples", (layer, head), every_head)
    with tokens:
        token_view(detail, labels, layer, head)
    if not first:
        draw_grids(sel, result, grids, (layer, head))
    one_head.markdown(f"**L{layer}H{head}: `{result['verdicts'][layer][head]}`**, entropy "
                      f"{result['entropy'][layer][head]:.3f} nats, normalised {result['normalized'][layer][head]:.3f}")
    show(charts_attention.pattern_heatmap(detail["pattern"], labels, detail["pieces"],
                                          f"L{layer}H{head} attention pattern"), one_head)
    show(charts.row_entropy_line(detail["row_entropy"], labels), one_head, stretch=True)


def draw_grids(sel: Selection, result: dict[str, Any], grids: Any, chosen: tuple[int, int]) -> None:
    """The entropy grid and the head-type grid: side by side where both fit, the head-type grid
    wrapping below where they do not (a chart wider than half the page never runs under the
    controls beside it)."""
    evidence = {k: v for k, v in result["evidence"].items() if isinstance(v, list)}
    row = grids.container(horizontal=True, gap="large")
    left, right = row.container(width="content"), row.container(width="content")
    pick(charts.entropy_grid(result["normalized"], result["verdicts"], evidence,
                             "normalised entropy and verdict per head"), "entropy", chosen, left)
    head_types(sel, right, chosen)
    grids.caption("Click a cell of either grid (or a heatmap of the layer's heads below) to pick that head; "
                  "the layer and head boxes do the same from the keyboard.")


def pick(chart: Any, name: str, chosen: tuple[int, int], where: Any = None) -> None:
    """Draw a chart on which a click picks a head. Its key names the head now chosen, so each
    pick starts from an empty selection: clicking a cell always reports it, even the cell
    clicked before the layer/head boxes moved elsewhere."""
    key = f"pick_{name}:{chosen[0]}:{chosen[1]}"
    if name != "multiples":
        chart = charts_attention.pickable(chart, chosen)
    show(chart, where, key=key, on_select=functools.partial(follow_pick, key),
         selection_mode=charts_attention.PICK)


def follow_pick(key: str) -> None:
    """The click's callback (run before the page): the layer/head boxes take the picked head."""
    chosen = charts_attention.picked(st.session_state.get(key))
    if chosen is not None:
        st.session_state["layer"], st.session_state["head"] = chosen


def token_view(detail: dict[str, Any], labels: list[str], layer: int, head: int) -> None:
    """What one token attends to: hover a token, or choose it in the box (the keyboard's way)."""
    n = len(labels)
    if st.session_state.get("attn_query") not in range(n):
        st.session_state.pop("attn_query", None)  # a shorter text: back to the last position
    query = st.selectbox("query position (or hover a token below)", list(range(n)), index=n - 1,
                         format_func=labels.__getitem__, key="attn_query")
    shown = [data.shown(p) for p in detail["pieces"]]
    show(charts_attention.token_view(detail["pattern"], shown, query,
                                     f"L{layer}H{head}: what each token attends to (hover a token)"))


HEAD_TYPES = {"previous token": "previous_token", "induction": "induction", "induction (random repeat)":
              "induction_repeat", "duplicate token": "duplicate_token", "sink (first position)": "sink",
              "copying (OV, -1..1)": "copying"}


def head_types(sel: Selection, where: Any, chosen: tuple[int, int]) -> None:
    """The head-type grid (probes.heads) beside the entropy grid."""
    types = data.head_types(*sel.key[:2], sel.text, sel.run.preset)
    choices = [label for label, name in HEAD_TYPES.items() if name in types["scores"]]
    label = where.radio("head type", choices, key="head_type")  # a column: as narrow as its grid
    title = f"{label} score per head" + (f" (period {types['repeat_length']})" if "repeat" in label else "")
    pick(charts.head_types_grid(types["scores"], HEAD_TYPES[label], title), "types", chosen, where)


# the page: Streamlit runs this file afresh as `__main__` on each load (app/shell.py's navigation); it
# draws with the imported module, so that every load shares one copy of it; an import draws nothing
if __name__ == "__main__":
    from app.views import attention
    from app.views.common import current

    attention.render(current())  # app/main.py put the sidebar's selection in session state
