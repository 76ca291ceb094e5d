"""The tuned lens on the Logit lens page: a second KL-per-layer line and the same grid, from the
translators saved beside the snapshot; an info line with the training command when there are none,
an error box when they belong to another model."""

from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from app import charts, data, run_files
from app.views.common import Selection, first_line, show
from app.views.lens_cells import lens_cells


def train_command(sel: Selection) -> str:
    ckpt = sel.snapshot
    try:
        ckpt = ckpt.relative_to(run_files.REPO)
    except ValueError:
        pass
    return f"python -m probes.tuned_lens --ckpt {ckpt} --steps 500"


def render_tuned(sel: Selection, logit: dict, measure: str, rank_top: int | None = None) -> None:
    """Below the logit lens: `logit` is its result (data.lens), `measure` the grid's colour, `rank_top`
    the top of the rank scale both grids share."""
    st.subheader("Tuned lens")
    lens_modified = data.tuned_lens_mtime(sel.snapshot)
    if lens_modified is None and not all(isinstance(v, float) and math.isfinite(v) for v in logit["cross_entropy"]):
        st.info("No tuned lens for this snapshot: it has diverged (the logit lens above is NaN or inf), so "
                "translators trained on it would be NaN too. Choose an earlier snapshot in the sidebar to train one.")
        return
    if lens_modified is None:
        st.info("No tuned lens for this snapshot yet (per-layer affine translators, Belrose et al. "
                f"2023). Train one (a few minutes on a CPU): `{train_command(sel)}`")
        return
    path, modified, preset = sel.key
    try:
        result = data.tuned(path, modified, lens_modified, sel.text, 5, preset)
    except ValueError as exc:  # a lens of another model, a broken file: one line
        st.error(f"Tuned lens: {first_line(exc)}")
        return
    trained = result["trained"]
    st.caption(f"Translators trained {trained['steps']} steps of {trained['batch_size']} windows "
               f"(seed {trained['seed']}) on {(trained.get('data') or {}).get('path')}: the residual "
               "stream mapped by A_l h + b_l, then decoded as the logit lens decodes it.")
    kl = pd.concat([
        pd.DataFrame({"layer": logit["layers"], "KL(final || layer)": logit["kl_to_final"], "lens": "logit lens"}),
        pd.DataFrame({"layer": result["layers"], "KL(final || layer)": result["kl_to_final"], "lens": "tuned lens"})])
    show(charts.per_layer_line(kl, "KL(final || layer)", "lens", "KL to the final layer: logit lens and tuned lens"),
         stretch=True)
    show(charts.lens_grid(lens_cells(result), measure, "tuned lens: top-1 token per layer and position", rank_top))
