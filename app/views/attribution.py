"""Direct logit attribution on the Logit lens page: which heads and MLPs write the prediction?"""

from __future__ import annotations

from typing import Any

import streamlit as st

from app import charts, data
from app.views.common import Selection, error_text, show
from probes.common import ProbeInputError


def render(sel: Selection, snap: Any) -> None:
    """A bar per component and a layer x head heatmap for one position of the sidebar's text;
    bad input (a token the vocabulary lacks, a position past the text) is an error box here."""
    st.subheader("Direct logit attribution")
    st.caption("Each head's and MLP's direct contribution to one token's logit, through the final "
               "norm's scale; with the embeddings and biases the bars sum to the logit.")
    n = data.encode(snap, sel.text).shape[1]
    c1, c2, c3 = st.columns(3)
    position = c1.number_input("position", min_value=-n, max_value=n - 1, value=-1, step=1, key="attr_position",
                               help="negative counts from the end")
    target = c2.text_input("target token", "", key="attr_target",
                           help="blank: the true next token, or the top prediction at the last position")
    versus = c3.text_input("versus token", "", key="attr_versus", help="blank: the logit itself")
    try:
        result = data.attribution(*sel.key[:2], sel.text, int(position), target or None, versus or None,
                                  sel.run.preset)
    except (ProbeInputError, ValueError) as exc:
        st.error(error_text(exc))
        return
    if result["logit"] is None:  # JSON's null: NaN or inf, a diverged snapshot
        st.warning("The model's logit at this position is NaN or inf (a diverged snapshot): there is "
                   "no finite logit to attribute.")
        return
    what = f"logit of {data.shown(result['target']['piece'] or str(result['target']['id']))}"
    if result["versus"] is not None:
        what += f" minus {data.shown(result['versus']['piece'] or str(result['versus']['id']))}"
    pieces = result["pieces"]
    st.markdown(f"**{what}** at position {result['position']} "
                f"(`{data.shown(pieces[result['position']] or '?')}`, target: {result['target']['source']}): "
                f"model {result['logit']:.3f}, sum of the bars {result['total']:.3f}")
    bound = charts.attribution_bound(result["values"], *result["heads"])  # one scale for both charts
    show(charts.attribution_bars(result["labels"], result["values"], "direct attribution per component", bound),
         stretch=True)
    show(charts.attribution_heatmap(result["heads"], "direct attribution per head", bound))
