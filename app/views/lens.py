"""Logit lens: what does each layer already predict?"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import charts, data, warm
from app.views import tuned
from app.views.common import Selection, has_attention, page, saved_note, show
from app.views.lens_cells import NOT_FINITE, lens_cells, with_nan
from probes.first_view import LENS_K

MEASURES = ["top-1 probability", "KL to final (nats)", "rank of the true next token"]


@page("Logit lens", "What does each layer already predict?")
def render(sel: Selection) -> None:
    snap = data.opening(sel.snapshot, sel.run.preset)  # no model yet: its config and tokenizer
    if not has_attention(snap) or snap.config.unembed == "mlp":
        st.info("Not applicable: the logit lens needs a residual stream read out by an unembedding, and "
                "this model (an MLP-family model, or one whose last MLP maps straight to the vocabulary) "
                "has none. See Overview, Embeddings and Training dynamics instead.")
        return
    saved_note(snap)
    measure = st.radio("colour by", MEASURES, horizontal=True, key="lens_measure")
    result = data.lens(*sel.key[:2], sel.text, LENS_K, sel.run.preset)
    cells = lens_cells(result)
    # one rank scale for the logit and the tuned lens
    rank_top = (snap.tokenizer.vocab_size if snap.tokenizer is not None else snap.config.d_vocab) - 1
    show(charts.lens_grid(with_nan(cells, measure), measure, "top-1 token per layer and position", rank_top))
    st.caption("Rows: the residual stream read through the unembedding after the embeddings (embed) and "
               "after each block N (N_post); the last row is the model's own prediction.")
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
    warm.before_first_model()  # the charts above are sent: the model loads behind them
    snap = data.snapshot(sel.snapshot, sel.run.preset)
    from probes.sources.attention import hooked  # torch: imported once a model is loaded, not with the page
    if not hooked(snap.model):  # nanochat's GPT: its lens reads its blocks through its own parts
        st.info(f"The tuned lens and direct logit attribution read hook points on a model's heads and MLPs, "
                f"which {model_name(snap)} has none of: the lens above reads "
                "its residual stream after each block, decoded through its own final norm and unembedding.")
        return
    tuned.render_tuned(sel, result, measure, rank_top)
    _attribution(sel, snap)


def model_name(snap) -> str:
    """`GPT (nanochat)`, or a snapshot of any model's class without its code: `PerHeadGPT`."""
    if data.saved_only(snap):
        return snap.config.architecture
    return f"{type(snap.model).__name__} ({snap.config.architecture})"


def _attribution(sel: Selection, snap: object) -> None:  # issue 21: the attribution view
    from app.views import attribution
    attribution.render(sel, snap)


# the page: Streamlit runs this file afresh as `__main__` on each load (app/shell.py's navigation); it
# draws with the imported module, so that every load shares one copy of it; an import draws nothing
if __name__ == "__main__":
    from app.views import lens
    from app.views.common import current

    lens.render(current())  # app/main.py put the sidebar's selection in session state
