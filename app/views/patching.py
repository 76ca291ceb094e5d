"""Patching: which components carry the prediction? A clean and a corrupted input; each component's
clean activation patched into the corrupt run (`probes.patching`), the share of the answer it brings
back as a heat map; a click on a cell shows that patched run's top predictions; below it, heads
ablated on the clean text (`app/views/ablation.py`)."""

from __future__ import annotations

import itertools
from typing import Any

import pandas as pd
import streamlit as st

from app import data
from app.views import ablation
from app.tokenizer_help import no_tokenizer
from app.views.common import Selection, error_text, has_attention, page, show
from probes.common import ProbeInputError

WHATS = {"heads": "each head's output", "resid": "the residual stream entering each block",
         "attn": "each attention block's output", "mlp": "each MLP's output"}
METHODS = {"attribution": "attribution (instant: 2 forwards, 1 backward)", "exact": "exact (one patched run per cell)"}
SHOWCASE = "induction"  # the shipped run the page opens on when nothing else was asked for
CELL = "cell"  # the heat map's point selection: a click picks one patched run
INPUTS = ("patch_clean", "patch_corrupt", "patch_answer", "patch_wrong")


@st.cache_resource(max_entries=4, show_spinner="Patching...")
def patching(path: str, modified: float, ask: tuple[str, str, str, str, str, bool, str, bool],
             preset: str | None) -> Any:
    """`probes.patching.run` on the snapshot: ask = (clean, corrupt, answer, wrong, what, by_position,
    method, atp_star). A resource, not data: the result keeps the model to run one patch again (its top
    predictions)."""
    from probes.patching import run

    clean, corrupt, answer, wrong, what, by_position, method, atp_star = ask
    snap = data.load(path, modified, preset)
    return run(snap.model, clean, corrupt, answer=answer, wrong=wrong or None, what=what, by_position=by_position,
               method=method, atp_star=atp_star, tokenizer=snap.tokenizer)


@st.cache_data(max_entries=64, show_spinner="Running the patched model...")
def top_predictions(path: str, modified: float, ask: tuple, index: tuple[int, ...], preset: str | None) -> list[dict]:
    return patching(path, modified, ask, preset).top_predictions(index, k=5)


def default_pair(tokenizer: Any, text: str, n_ctx: int) -> tuple[str, str, str, str]:
    """(clean, corrupt, answer, wrong) from the sidebar's text: its first tokens S (up to 16, half the
    context) then S again without its last token, whose answer is S's last token; the corrupt run
    has S reversed first, where the same last token is followed by S's third-to-last (the wrong one)."""
    ids = tokenizer.encode(text)[:max(3, min(16, n_ctx // 2))]
    if len(ids) < 3:
        raise ValueError("the sidebar's text is under 3 tokens: type a clean and a corrupt text here")
    decode = tokenizer.decode
    return decode(ids + ids[:-1]), decode(ids[::-1] + ids[:-1]), decode(ids[-1:]), decode(ids[-3:-2])


def follow_defaults(defaults: tuple[str, str, str, str]) -> None:
    """The boxes take the run's defaults while the user has not edited them (as the sidebar's text)."""
    old = st.session_state.get("patch_defaults")
    for key, new, before in zip(INPUTS, defaults, old or (None,) * 4):
        if st.session_state.get(key, before) == before:
            st.session_state[key] = data.shown_newlines(new)
    st.session_state["patch_defaults"] = tuple(data.shown_newlines(d) for d in defaults)


def open_showcase(sel: Selection) -> None:
    """On its first visit, with no run named in the address nor picked in the sidebar, the page opens
    on the shipped induction run (a patch with a known answer) where there is one."""
    if st.session_state.get("patching_seen"):
        return
    st.session_state["patching_seen"] = True
    if st.session_state.get("asked_run") or st.session_state.get("run_picked") or sel.run.label == SHOWCASE:
        return
    if any(s.label == SHOWCASE for s in sel.sources):
        st.switch_page("views/patching.py", query_params={"run": SHOWCASE})


@page("Patching", "Which components carry the prediction? Each one's clean activation is patched into a "
                  "corrupted run: how much of the clean answer comes back?")
def render(sel: Selection) -> None:
    open_showcase(sel)
    snap = data.opening(sel.snapshot, sel.run.preset)  # no model yet: its config and tokenizer
    if not has_attention(snap) or data.saved_only(snap):
        st.info("Not applicable: patching runs a transformer's heads (this model has none, or was saved without "
                "its code). See Overview and Development instead.")
        return
    if snap.tokenizer is None:
        raise no_tokenizer(snap)
    follow_defaults(default_pair(snap.tokenizer, sel.text, snap.config.n_ctx))
    c1, c2 = st.columns(2)
    clean = c1.text_input("clean text", key="patch_clean", help="the run whose answer is right")
    corrupt = c2.text_input("corrupt text", key="patch_corrupt", help="the same number of tokens, changed so "
                            "that the answer is lost")
    c1, c2, c3, c4 = st.columns([1, 1, 2, 2])
    answer = c1.text_input("answer token", key="patch_answer", help="one token: what the clean text predicts next")
    wrong = c2.text_input("wrong token", key="patch_wrong", help="one token, or blank: the metric is then the "
                          "answer's log-probability, not the logit difference answer - wrong")
    what = c3.selectbox("patch", list(WHATS), format_func=WHATS.__getitem__, key="patch_what")
    method = c4.radio("method", list(METHODS), format_func=METHODS.__getitem__, key="patch_method", horizontal=True)
    c1, c2 = st.columns(2)
    by_position = c1.checkbox("each position apart", value=True, key="patch_by_position")
    atp_star = method == "attribution" and c2.checkbox(
        "AtP* (the attention softmax recomputed where a patch moves queries or keys)", value=True,
        key="patch_atp_star", help="Kramár et al. 2024: plain attribution misjudges attention that saturates")
    ask = (data.real_newlines(clean), data.real_newlines(corrupt), data.real_newlines(answer),
           data.real_newlines(wrong), what, by_position, method, atp_star)
    try:
        result = patching(*sel.key[:2], ask, sel.run.preset)
    except (ProbeInputError, ValueError) as exc:  # texts of two lengths, an answer of two tokens, an empty text
        st.error(error_text(exc))
        return
    summary(result)
    chosen = heat_map(result, sel.run.label)
    predictions(sel, ask, result, chosen)
    ablation.render(sel, snap, ask[0], strongest_heads(result))


def summary(result: Any) -> None:
    metric = "logit difference" if result.metric == "logit_diff" else result.metric
    how = (f"estimated from 2 forwards and 1 backward{', with AtP*' if result.atp_star else ''}"
           if result.method == "attribution" else f"{result.forwards} batched forward passes")
    st.markdown(f"**{metric}**: clean run {result.clean:.3f}, corrupt run {result.corrupt:.3f}; "
                f"{result.method} patching ({how}).")
    if result.method == "attribution":
        st.caption("Attribution patching is a first-order estimate: choose exact to measure every patch "
                   "(where it misleads: docs/patching.md). A cell's top predictions are its exact patch.")


def effect_rows(result: Any) -> pd.DataFrame:
    """One row per cell of `normalised`: its heat map row (L1H0, or L1) and column (a position with its
    token, a head, or every position), its index into the result (for a click) and its values."""
    norm, patched, axes = result.normalised, result.patched, result.axes
    pieces = [data.shown(p or "?") for p in result.pieces]
    rows = []
    for index in itertools.product(*(range(n) for n in norm.shape)):
        cell = dict(zip(axes, index))
        heads_by_pos = "head" in cell and "pos" in cell
        rows.append({"row": f"L{cell['layer']}" + (f"H{cell['head']}" if heads_by_pos else ""),
                     "column": (f"{cell['pos']}: {pieces[cell['pos']]}" if "pos" in cell else
                                f"H{cell['head']}" if "head" in cell else "every position"),
                     CELL: ",".join(map(str, index)), "effect": float(norm[index]), "metric": float(patched[index])})
    return pd.DataFrame(rows)


def heat_map(result: Any, run: str) -> tuple[int, ...]:
    """The normalised effect per cell, clicked to pick one; returns the picked cell (the strongest at first)."""
    import altair as alt

    frame = effect_rows(result)
    strongest = tuple(int(i) for i in frame.loc[frame["effect"].fillna(0).abs().idxmax(), CELL].split(","))
    pick = alt.selection_point(name=CELL, fields=[CELL], on="click", clear=False)
    columns, rows = list(dict.fromkeys(frame["column"])), list(dict.fromkeys(frame["row"]))
    chart = alt.Chart(frame, title=f"share of the clean answer restored ({result.what}, 1 = all of it)").mark_rect(
        stroke="white").encode(
        x=alt.X("column:N", sort=columns, title="position" if "pos" in result.axes else None),
        y=alt.Y("row:N", sort=rows, title=None),
        color=alt.Color("effect:Q", scale=alt.Scale(scheme="redblue", domain=[-1, 1], reverse=True), title="effect"),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.55)),
        tooltip=["row", "column", alt.Tooltip("effect:Q", format=".3f"), alt.Tooltip("metric:Q", format=".3f")],
    ).add_params(pick).properties(width=max(120, 18 * len(columns)), height=max(60, 22 * len(rows)))
    event = show(chart, key=f"patch_map:{run}:{result.what}:{result.by_position}", on_select="rerun",
                 selection_mode=CELL)
    try:
        points = event["selection"][CELL]
        return tuple(int(i) for i in points[0][CELL].split(",")) if points else strongest
    except (KeyError, TypeError, IndexError):
        return strongest


def predictions(sel: Selection, ask: tuple, result: Any, index: tuple[int, ...]) -> None:
    where = ", ".join(f"{axis} {i}" for axis, i in zip(result.axes, index))
    st.markdown(f"**The patched run at {where}** (normalised effect {float(result.normalised[index]):.3f}): "
                "its top predictions after the last token")
    top = top_predictions(*sel.key[:2], ask, index, sel.run.preset)
    st.dataframe(pd.DataFrame([{"token": data.shown(t["piece"] or str(t["id"])), "probability": t["prob"],
                                "logit": t["logit"]} for t in top]), hide_index=True)
    st.caption("Click a cell of the heat map to see another patched run.")


def strongest_heads(result: Any, most: int = 4) -> list[tuple[int, int]]:
    """The heads whose patch restores the most (over positions), for the ablation panel's first ticks."""
    if result.what != "heads":
        return []
    norm = result.normalised.nan_to_num(0.0)
    per_head = norm.amax(dim=1) if result.by_position else norm  # [layer head]
    order = per_head.flatten().argsort(descending=True)[:most].tolist()
    n_heads = per_head.shape[1]
    return [(i // n_heads, i % n_heads) for i in order if per_head.flatten()[i] > 0.2]


if __name__ == "__main__":
    from app.views import patching as view
    from app.views.common import current

    view.render(current())  # app/main.py put the sidebar's selection in session state
