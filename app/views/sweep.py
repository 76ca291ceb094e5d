"""Sweep: which learning rates diverge, with and without the fix? (`python -m train.sweep`)

Final val loss against learning rate, one line per variant, each run's point shaped by the run
doctor's verdict and diverged runs marked on the top edge (a click opens the run); then each
variant's LR sensitivity and widest stable range, and the table of every run. All of it read from
sweep.json through `probes.sweep` (`app.sweeps`). `?sweep=NAME` names the sweep shown.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from app import sweeps
from app.views.common import error_text, show
from probes.sweep import STABLE_NOTE, range_text, rate_text

OPENED = "sweep_opened"  # clicks followed so far: each chart starts with no point selected


def render(folders: list[Path], sources: list[Any]) -> None:
    st.title("Sweep")
    st.caption("Which learning rates diverge, with and without the fix? (`python -m train.sweep`)")
    if not folders:
        st.info("No sweep found: run `python -m train.sweep ... --out sweeps/x`, then pass "
                "`-- --runs sweeps/x` (or `sweeps/`) to `streamlit run app/main.py`.")
        return
    labels = [sweeps.label_of(f, folders) for f in folders]
    wanted = st.query_params.get("sweep")
    chosen = st.selectbox("sweep", labels, index=labels.index(wanted) if wanted in labels else 0, key="sweep_pick")
    if st.query_params.get("sweep") != chosen:
        st.query_params["sweep"] = chosen
    if wanted and wanted not in labels:
        st.warning(f"`?sweep={wanted}` names no sweep here. Known sweeps: {', '.join(labels)}.")
    folder = folders[labels.index(chosen)]
    try:
        result = sweeps.read(folder)
    except Exception as exc:  # noqa: BLE001 - the page says it; the app keeps working
        st.error(error_text(exc))
        return
    run_labels = {s.path.name: s.label for s in sources if s.path.parent.resolve() == folder.resolve()}
    headline(result)
    plot(result, run_labels, chosen)
    summary(result)
    table(result, run_labels)


def headline(result: dict[str, Any]) -> None:
    grid, runs = result["grid"], result["runs"]
    done = sum(r["status"] == "finished" for r in runs)
    vary = "; ".join(f"{k} = {', '.join(v)}" for k, v in grid.get("vary", {}).items()) or "no --vary axis"
    st.markdown(f"**{grid['preset']}**, rates {', '.join(rate_text(r) for r in grid['rates'])}; {vary}. "
                f"{done} of {len(runs)} runs finished; the sweep is {result.get('status', '?')}.")
    if grid.get("train_args"):
        st.caption("Every run also got: `" + " ".join(grid["train_args"]) + "`")


def plot(result: dict[str, Any], labels: dict[str, str], sweep: str) -> None:
    frame = sweeps.points(result, labels)
    if frame.empty:
        st.info("No run has finished yet: the chart appears with the first one.")
        return
    key = f"sweep_chart:{sweep}:{st.session_state.get(OPENED, 0)}"
    event = show(sweeps.chart(frame), key=key, on_select="rerun", selection_mode=sweeps.CLICK)
    run = sweeps.clicked(event)
    if run is not None and run in labels.values():
        st.session_state[OPENED] = st.session_state.get(OPENED, 0) + 1
        st.switch_page("views/overview.py", query_params={"run": run})


def summary(result: dict[str, Any]) -> None:
    st.subheader("LR sensitivity and stable range per variant")
    rows = [{"variant": v["name"],
             "LR sensitivity (nats)": v.get("lr_sensitivity"),
             "stable rates": range_text(v.get("stable_range")),
             "decades": (v.get("stable_range") or {}).get("decades"),
             "diverged": f"{v.get('diverged', 0)} of {v.get('finished', 0)}",
             "best": "-" if v.get("best_lr") is None else f"{v['best_val_loss']:.3f} at lr {rate_text(v['best_lr'])}",
             "runs finished": f"{v.get('finished', 0)} of {v.get('runs', 0)}"} for v in result.get("variants", [])]
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch", column_config={
        "LR sensitivity (nats)": st.column_config.NumberColumn(
            format="%.3f", help="Wortsman et al. 2023: over the swept rates, the mean of min(final loss, loss "
                                "at init) minus the best of those (a diverged run counts as its loss at init); "
                                "0 = every rate reached the best loss"),
        "stable rates": st.column_config.TextColumn(help=STABLE_NOTE),
        "decades": st.column_config.NumberColumn(format="%.1f", help="the width of the stable rates, log10(hi / lo)")})


def table(result: dict[str, Any], labels: dict[str, str]) -> None:
    st.subheader("Every run")
    st.dataframe(pd.DataFrame(sweeps.run_rows(result, labels)), hide_index=True, width="stretch",
                 column_config=RUN_COLUMNS)
    links(result, labels)


RUN_COLUMNS = {
    "final val loss": st.column_config.NumberColumn(format="%.3f", help="none for a diverged run"),
    "diverged at": st.column_config.NumberColumn(format="%d", help="step of the first NaN/inf record, or of "
                                                                 "the doctor's divergence finding")}


def links(result: dict[str, Any], labels: dict[str, str]) -> None:
    """"Open a run" links, each named by the run's own folder name (`lr=1e-03,qk_norm=none`): on a
    sweep's page the sweep's name is what every run shares, and the part that tells them apart is
    what a column keeps; the link itself names the run by its app label."""
    runs = [r for r in result["runs"] if r["dir"] in labels]
    if not runs:
        return
    st.markdown("**Open a run**")
    columns = st.columns(3)
    for i, r in enumerate(runs):
        columns[i % len(columns)].page_link("views/overview.py", label=r["dir"],
                                            query_params={"run": labels[r["dir"]]}, icon=":material/arrow_forward:")


# the page: Streamlit runs this file afresh as `__main__` on each load (app/shell.py's navigation); it
# draws with the imported module, so that every load shares one copy of it; an import draws nothing
if __name__ == "__main__":
    from app.views import sweep

    # the sweeps and runs app/main.py found
    sweep.render(st.session_state.get("sweeps") or [], st.session_state.get("sources") or [])
