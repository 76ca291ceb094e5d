"""The landing view: which runs are here, how did each end, and which one to look at?

It reads each run's files only (run.json, metrics.jsonl; no model is loaded) and the run doctor's
cached verdict (`app.catalog.summary`), so it opens at once; a link per run opens its Overview.
It keeps itself current: a run folder that appears under the run roots is listed within
WATCH_EVERY (one full rerun, so the sidebar lists it too), and while a run trains its row re-reads.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pandas as pd
import streamlit as st

from app import catalog, data, run_files, sweeps
from app.views import live
from app.views import sweep as sweep_view
from app.views.common import first_line

WATCH_EVERY = timedelta(seconds=5)

COLUMNS = ["run", "model", "steps", "snapshots", "last val loss", "state", "doctor"]
STATE_COLOURS = {"healthy": "#2ca02c", "diverged": "#d62728", "training now": "#1f77b4",
                 "failed": "#d62728", "warning": "#f58518", "unreadable": "#d62728", "too short": "#7f7f7f"}


# widths in px: at 1280 px with the sidebar open the table has ~818 px, and every cell of the shipped
# runs is drawn whole (tests/test_browser_runlist.py); the run column sizes itself to the names
TABLE_COLUMNS = {
    "model": st.column_config.TextColumn(width=224, help="preset · layers×heads and width (the preset is left "
                                                         "out where the run is named after it)"),
    "steps": st.column_config.NumberColumn(format="%d", width=55, help="last logged step (else the latest "
                                                                       "checkpoint's)"),
    "snapshots": st.column_config.NumberColumn(format="%d", width=78),
    "last val loss": st.column_config.TextColumn("val loss", width=82, help="the last val loss logged; a sweep's "
                                                                             "row: the best final one of its runs"),
    "state": st.column_config.TextColumn(
        width=108, help="what the files hold: logged; diverged: a NaN/inf loss or a 'diverged' record; training "
                        "now: metrics written in the last 2 minutes under a lock; a sweep's row: how many of its "
                        "runs diverged (how many are done, while it runs)"),
    "doctor": st.column_config.TextColumn(
        width=84, help="the run doctor's verdict (probes.diagnose), the one word on a run's health: see the "
                       "Overview; a sweep's row: how many of its runs got the worst verdict (every count is "
                       "under Sweeps)")}


def render(sources: list[data.Source]) -> None:
    st.title("Runs")
    st.caption("Which run do you want to look at? Pick one below or in the sidebar; "
               "`?run=NAME` in the address opens a run's Overview directly.")
    st.fragment(watch_runs, run_every=WATCH_EVERY)(sources)
    if not sources:
        st.info("No runs found: pass `-- --runs DIR` to `streamlit run app/main.py`, or type a path "
                "under \"Open a path\" in the sidebar.")
        return
    folders = st.session_state.get("sweeps") or []
    listed, folded = fold(sources, folders)  # a sweep's runs fold under its row
    live.live(table, any(s.is_run and run_files.is_training(s.path) for s in sources))(listed, folders)
    sweep_list(folders, folded)
    if not listed:
        return
    st.markdown("**Open a run**")
    columns = st.columns(4)
    for i, source in enumerate(listed):
        columns[i % len(columns)].page_link("views/overview.py", label=catalog.shown(source),
                                            query_params={"run": source.label}, icon=":material/arrow_forward:")


def fold(sources: list[data.Source], folders: list[Path]) -> tuple[list[data.Source], dict[Path, dict[str, str]]]:
    """(the sources outside every sweep, {sweep folder resolved: {run folder name: label}}), each
    source's folder resolved once."""
    inside = {f.resolve() for f in folders}
    listed: list[data.Source] = []
    folded: dict[Path, dict[str, str]] = {}
    for source in sources:
        parent = source.path.parent.resolve()
        if parent in inside:
            folded.setdefault(parent, {})[source.path.name] = source.label
        else:
            listed.append(source)
    return listed, folded


def sweep_list(folders: list[Path], folded: dict[Path, dict[str, str]]) -> None:
    """The learning-rate sweeps found (python -m train.sweep), each with its LR sensitivities, then
    each sweep's runs (from its sweep.json; `folded`, from `fold`) folded under it, with a link to each."""
    if not folders:
        return
    st.subheader("Sweeps")
    rows, labels = [], [sweeps.label_of(f, folders) for f in folders]
    results: dict[str, dict] = {}
    for label, folder in zip(labels, folders):
        try:
            results[label] = sweeps.read(folder)
            rows.append({"sweep": label, **sweeps.overview_row(results[label])})
        except Exception as exc:  # noqa: BLE001 - one row says so; the Sweep page says why
            rows.append({"sweep": label, "status": f"unreadable: {first_line(exc)}"})
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
    columns = st.columns(4)
    for i, label in enumerate(labels):
        columns[i % len(columns)].page_link("views/sweep.py", label=f"Sweep {label}", query_params={"sweep": label},
                                            icon=":material/show_chart:")
    for label, folder in zip(labels, folders):
        if label not in results:
            continue
        runs = folded.get(folder.resolve(), {})
        counts = sweeps.verdict_counts(results[label])
        with st.expander(f"{label}: its {len(results[label]['runs'])} runs" + (f" ({counts})" if counts else "")):
            st.dataframe(pd.DataFrame(sweeps.run_rows(results[label], runs)), hide_index=True, width="stretch",
                         column_config=sweep_view.RUN_COLUMNS)
            sweep_view.links(results[label], runs)


def watch_runs(sources: list[data.Source]) -> None:
    """Draws nothing: reruns the app when a run folder appeared under the run roots or one listed is gone."""
    known = {s.path.resolve() for s in sources}
    found = {s.path.resolve() for s in data.discover(st.session_state.get("run_roots") or [])}
    if found - known or any(not s.path.exists() for s in sources):
        st.rerun()


def table(sources: list[data.Source], folders: list[Path]) -> None:
    """A row per run, and one per sweep (its runs are listed under Sweeps, from its sweep.json)."""
    rows = pd.DataFrame([catalog.summary(s) for s in sources] + [sweep_row(f, folders) for f in folders],
                        columns=COLUMNS)
    for column in ("steps", "snapshots"):
        rows[column] = whole_numbers(rows[column])
    st.dataframe(rows.style.map(colour, subset=["state", "doctor"]), hide_index=True, width="stretch",
                 column_config=TABLE_COLUMNS)


def sweep_row(folder: Path, folders: list[Path]) -> dict:
    label = sweeps.label_of(folder, folders)
    try:
        return {"run": label, **sweeps.list_row(sweeps.read(folder), folder)}
    except Exception as exc:  # noqa: BLE001 - one row says so; the Sweep page says why
        return {"run": label, "model": "-", "state": f"unreadable: {first_line(exc)}", "doctor": "-"}


def whole_numbers(column: pd.Series) -> pd.Series:
    """Counts shown as integers (4, never 4.000000). A count past int64 (a log claiming step
    2**70) cannot be an Int64: that column is shown as floats rather than failing every run's row."""
    if all(v is None or pd.isna(v) or abs(v) < 2 ** 63 for v in column):
        return column.astype("Int64")
    return column.map(lambda v: float("nan") if v is None else float(v))


def colour(value: object) -> str:
    """A state or verdict in its colour: `failed`, `unreadable: ...`, and a sweep's `4 failed`, `4/14 diverged`."""
    key = str(value).split(":")[0]
    key = key if key in STATE_COLOURS else key.split(" ")[-1]
    return f"color: {STATE_COLOURS[key]}; font-weight: bold" if key in STATE_COLOURS else ""


# the page: Streamlit runs this file afresh as `__main__` on each load (app/shell.py's navigation); it
# draws with the imported module, so that every load shares one copy of it; an import draws nothing
if __name__ == "__main__":
    from app.views import home

    home.render(st.session_state.get("sources") or [])  # the runs app/main.py found
