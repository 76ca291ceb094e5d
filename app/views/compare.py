"""Compare: how do runs differ over training, and two snapshots (of any runs) on the same text?

Runs overlaid and their config diff come first (`app.views.overlay`); then two snapshots A and B,
each any snapshot of any run, side by side: entropy grids, their difference, logit-lens KL."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import charts, data, overlay_data, run_files
from models.store.run import snapshot_step
from app.views import overlay
from app.views.common import Selection, error_text, has_attention, page, show
from probes.first_view import LENS_K


@page("Compare", "How do runs differ over training, and two snapshots on the same text?", needs_model=False)
def render(sel: Selection) -> None:
    overlay.section(sel)
    snapshots(sel)


def snapshot_options(sel: Selection) -> dict[str, tuple[data.Source, object]]:
    """"run / step_NNNNNN" -> (source, snapshot path) for every snapshot of every source, the
    sidebar's run first."""
    ordered = [sel.run] + [s for s in sel.sources if s.path != sel.run.path]
    return {f"{source.label} / {p.name}": (source, p) for source in ordered for p in source.snapshots()}


def snapshots(sel: Selection) -> None:
    st.subheader("Snapshots side by side")
    options = snapshot_options(sel)
    labels = list(options)
    if not labels:
        st.info("No run here saved a snapshot: nothing to put side by side.")
        return
    here = f"{sel.run.label} / {sel.snapshot.name}" if sel.snapshot is not None else labels[0]
    overlaid = st.session_state.get(overlay.runs_key(sel), [])  # the runs overlaid above, as the user left them
    other_default = overlay_data.snapshot_b(labels, here, overlaid)
    c1, c2 = st.columns(2)
    a = options[c1.selectbox("A", labels, index=labels.index(here), key="cmp_a")]
    b = options[c2.selectbox("B", labels, index=labels.index(other_default), key="cmp_b")]
    results = [probe(run, path, sel.text) for run, path in (a, b)]
    for column, (run, path), result in zip((c1, c2), (a, b), results):
        with column:
            st.markdown(f"**{run.label} / {path.name}**: val loss {result['val_loss']}")
            if "error" in result:
                st.error(result["error"])
            elif result["attention"]:  # fitted to the column: a 6-head grid is wider than half a page
                att = result["attention"]
                show(charts.entropy_grid(att["normalized"], att["verdicts"], {}, "normalised entropy"),
                     stretch=True)
            else:
                st.info("No attention heads (an MLP-family model): only its val loss compares here.")
    attn = [r["attention"] for r in results]
    if all(attn) and [len(x["normalized"]) for x in attn] == [len(attn[1]["normalized"])] * 2 \
            and len(attn[0]["normalized"][0]) == len(attn[1]["normalized"][0]):
        show(charts.difference_grid(attn[0]["normalized"], attn[1]["normalized"],
                                    "B - A: normalised entropy (red: B more focused)"))
    names = [f"{ab}: {run.label} / {path.name}" for ab, (run, path) in zip("AB", (a, b))]  # name the snapshots
    kl = [{"layer": layer, "run": name, "KL(final || layer)": value}
          for name, r in zip(names, results) if r.get("lens")
          for layer, value in zip(r["lens"]["layers"], r["lens"]["kl_to_final"])]
    if kl:
        show(charts.per_layer_line(pd.DataFrame(kl), "KL(final || layer)", "run", "logit-lens KL per layer"),
             stretch=True)


def probe(run: data.Source, path, text: str) -> dict:
    out: dict = {"attention": None, "lens": None, "val_loss": "-"}
    records = [r for r in run_files.metrics(run.path) if r.get("step") == snapshot_step(path)] \
        if run.is_run else []
    if records and isinstance(records[0].get("val_loss"), float):
        out["val_loss"] = f"{records[0]['val_loss']:.3f}"
    try:
        snap = data.opening(path, run.preset)  # the first view saved beside it needs no model
        key = (str(path), data.mtime(path))
        if has_attention(snap):
            out["attention"] = data.attention(*key, text, run.preset)
            if snap.config.unembed != "mlp":
                out["lens"] = data.lens(*key, text, LENS_K, run.preset)
    except Exception as exc:  # noqa: BLE001 - shown beside the other side, which keeps working
        out["error"] = error_text(exc)
    return out


# the page: Streamlit runs this file afresh as `__main__` on each load (app/shell.py's navigation); it
# draws with the imported module, so that every load shares one copy of it; an import draws nothing
if __name__ == "__main__":
    from app.views import compare
    from app.views.common import current

    compare.render(current())  # app/main.py put the sidebar's selection in session state
