"""Head ablation on the Patching page: tick heads, see the clean text's loss with and without them and
each predicted token's loss change (`probes.ablate`)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from app import data
from app.views.common import Selection, error_text, show
from probes.common import ProbeInputError

HOWS = {"zero": "zero (the head's output set to 0)", "mean": "mean (its mean output over the text)"}


@st.cache_data(max_entries=32, show_spinner="Ablating...")
def ablation(path: str, modified: float, text: str, heads: tuple[tuple[int, int], ...], how: str,
             preset: str | None = None) -> dict[str, Any]:
    """`probes.ablate.run` on the text's first window, with its tokens' pieces."""
    from probes import ablate

    snap = data.load(path, modified, preset)
    ids = data.encode(snap, text)  # [1 pos]
    result = ablate.run(snap.model, ids, heads=list(heads), how=how)
    return {**result.to_dict(), "pieces": data.pieces(snap, ids[0].tolist())}


def head_name(head: tuple[int, int]) -> str:
    return f"L{head[0]}H{head[1]}"


def render(sel: Selection, snap: Any, text: str, suggested: list[tuple[int, int]]) -> None:
    """The panel, on `text` (the clean text); `suggested`: the heads ticked first."""
    st.subheader("Head ablation")
    st.caption("The clean text's next-token loss with every head, and with the ticked heads removed: all of them "
               "together, and each alone.")
    cfg = snap.config
    heads = [(layer, head) for layer in range(cfg.n_layers) for head in range(cfg.n_heads)]
    names = [head_name(h) for h in heads]
    c1, c2 = st.columns([3, 2])
    ticked = c1.multiselect("heads to ablate", names, default=[head_name(h) for h in suggested],
                            key=f"ablate_heads:{sel.run.label}:{cfg.n_layers}x{cfg.n_heads}")
    how = c2.radio("ablation", list(HOWS), format_func=HOWS.__getitem__, key="ablate_how", horizontal=True)
    if not ticked:
        st.info("Tick one or more heads to ablate them.")
        return
    try:
        result = ablation(*sel.key[:2], text, tuple(heads[names.index(n)] for n in ticked), how, sel.run.preset)
    except (ProbeInputError, ValueError) as exc:
        st.error(error_text(exc))
        return
    loss, together = result["loss"], result["together"]
    st.markdown(f"**Loss {loss:.3f}** with every head; **{together:.3f}** without {', '.join(ticked)} "
                f"({together - loss:+.3f} nats).")
    if len(ticked) > 1:
        st.dataframe(pd.DataFrame([{"head alone": head_name(e["head"]), "loss": e["loss"], "change": e["change"]}
                                   for e in result["each"]]), hide_index=True)
    show(per_token_chart(result), stretch=True)


def per_token_chart(result: dict[str, Any]) -> Any:
    """A bar per predicted token: its loss without the ticked heads minus with them."""
    import altair as alt

    pieces = result["pieces"]
    change = result["per_token"][0]  # [pos-1]: row i predicts token i+1
    frame = pd.DataFrame([{"token": f"{i + 1}: {data.shown(pieces[i + 1])}", "change": v}
                          for i, v in enumerate(change)])
    return alt.Chart(frame, title="each predicted token's loss change without the ticked heads").mark_bar().encode(
        x=alt.X("token:N", sort=list(frame["token"]), title="predicted token"),
        y=alt.Y("change:Q", title="loss change (nats)"),
        color=alt.condition(alt.datum.change > 0, alt.value("crimson"), alt.value("steelblue")),
        tooltip=["token", alt.Tooltip("change:Q", format=".3f")]).properties(height=200)
