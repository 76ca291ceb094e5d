"""What every page load draws around its page (app/main.py runs `main` as the script): the sidebar,
the navigation, and the page.

Runs come from `checkpoints/` (the shipped story), every `--runs DIR` after `--`, the
`SCRATCHSCOPE_RUNS` environment variable (os.pathsep-separated; tests use it) and a path typed in
the sidebar (selected at once). The app opens on the landing view (a table of the runs);
`?run=NAME` opens that run's Overview instead, and names no run -> a warning above the page. The
sidebar picks a run, one of its snapshots and the text to probe; each page answers one question.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from pathlib import Path

import streamlit as st

from app import catalog, data, run_files, sweeps, warm
from app.logs import history_only
from app.views.common import PAGES, Selection
from app.views.live import FOLLOWS_NEWEST, newest_unless_moved, snapshot_slider_key
from probes.first_view import PAGE_TEXT

ROOT = Path(__file__).resolve().parent.parent


def run_roots() -> list[Path]:
    parser = argparse.ArgumentParser(prog="streamlit run app/main.py --")
    parser.add_argument("--runs", nargs="+", type=Path, default=[],
                        help="run directories, or folders holding runs (the shipped ones are always listed)")
    args, _ = parser.parse_known_args(sys.argv[1:])
    env = [Path(p) for p in os.environ.get("SCRATCHSCOPE_RUNS", "").split(os.pathsep) if p]
    shipped = [] if os.environ.get("SCRATCHSCOPE_NO_SHIPPED") else [ROOT / "checkpoints"]
    return [*args.runs, *env, *shipped]


def typed_sources() -> list[data.Source]:
    """Sources from a path typed in the sidebar (a snapshot, a run, a folder of runs, a nanoGPT
    ckpt.pt or out_dir, a Hugging Face GPT-2 directory, or a series .pt with a preset); a path
    that is none of these is refused there with a message."""
    with st.sidebar.expander("Open a path", expanded=bool(st.session_state.get("typed_path"))):
        path = st.text_input("snapshot, run, nanoGPT ckpt.pt, Hugging Face GPT-2 directory or .pt file",
                             key="typed_path",
                             help="A training log opens too: a W&B run folder or its run-<id>.wandb, TensorBoard "
                                  "events, trainer_state.json, a printed nanoGPT or llm.c log (*.log, *.txt, *.out), "
                                  "or a folder of them.")
        preset = st.text_input("preset (for a .pt state dict)", key="typed_preset")
        if not path:
            return []
        try:
            return catalog.typed(path, preset or None)
        except ValueError as exc:
            st.error(str(exc))
            return []


def default_text(path: Path | None, preset: str | None = None) -> str:
    """The sidebar's first text: PAGE_TEXT where the snapshot's tokenizer encodes it, else the text of
    what the snapshot read when it was saved (its first view's ids, or its saved sample's first row),
    so that a run whose vocabulary lacks a character of PAGE_TEXT opens on every page without an
    error. Read without torch."""
    found = None if path is None else data.front(str(path), data.mtime(path), preset)
    if found is None or found.tokenizer is None:
        return PAGE_TEXT
    try:
        found.tokenizer.encode(PAGE_TEXT)
        return PAGE_TEXT
    except ValueError:
        pass
    view = data.first_view(str(path), data.mtime(path), preset)
    try:
        if view is not None and view.tokens:
            return found.tokenizer.decode(view.tokens)
        if found.kind == "any-model":
            from models.store.any_files import read_readings
            return found.tokenizer.decode([int(i) for i in read_readings(found.path, found.meta)["sample.tokens"][0]])
    except (ValueError, OSError, KeyError, IndexError) as err:
        logging.getLogger(__name__).info("%s: no saved text to open on (%s)", path, err)
    return PAGE_TEXT


def pick_text(run: data.Source, snapshot: Path | None = None) -> str:
    st.sidebar.markdown("**Text to probe**")
    default = default_text(snapshot, run.preset)  # one the run's tokenizer encodes
    if st.session_state.get("text", st.session_state.get("text_default")) == st.session_state.get("text_default"):
        st.session_state["text"] = default  # untouched by the user: follow the run picked
    st.session_state["text_default"] = default
    corpus = run_files.data_file(run.path) if run.is_run else None
    if run.is_run and corpus is None and run_files.recorded_data(run.path):
        st.sidebar.caption(f"The run's data file {run_files.recorded_data(run.path)} is not here, "
                           "so random passages are off.")
    if corpus is not None and st.sidebar.button("Random passage from the run's data", width="stretch"):
        st.session_state["seed"] = st.session_state.get("seed", 0) + 1
        st.session_state["text"] = run_files.random_passage(corpus, 240, st.session_state["seed"])
    return st.sidebar.text_area("text", height=140,  # its value: st.session_state["text"], set above
                                key="text", label_visibility="collapsed",
                                help="the first context window of this text is probed")


def sidebar() -> tuple[Selection | None, list[data.Source]]:
    st.sidebar.title("scratchscope")
    typed = typed_sources()
    roots = run_roots()
    st.session_state["sweeps"] = sweeps.discover(roots)  # their runs are listed like any other
    sources = catalog.labelled([*typed, *data.discover([*roots, *st.session_state["sweeps"]])])
    if not sources:
        st.sidebar.error("No runs found: pass `-- --runs DIR` or type a path above.")
        return None, []
    labels = [s.label for s in sources]
    follow_requests(sources, typed)
    if st.session_state.get("run") not in labels:
        st.session_state["run"] = labels[0]
    shown = {s.label: catalog.shown(s) for s in sources}  # a sweep's run: the part that differs first
    chosen = sources[labels.index(st.sidebar.selectbox("run", labels, key="run", on_change=picked,
                                                       format_func=shown.__getitem__))]
    snaps = chosen.snapshots()
    if not snaps and (chosen.is_run and run_files.metrics(chosen.path) or history_only(chosen.path)):
        # a Monitor's run without weights, a training log (or llm.c's folder of one): its history only
        st.sidebar.caption("No snapshot saved: this run's history only.")
        return Selection(chosen, None, pick_text(chosen), sources), sources
    if not snaps:
        st.sidebar.error(f"{chosen.path} holds no snapshots")
        return None, sources
    names = [p.name for p in snaps]
    key = snapshot_slider_key(chosen)
    newest_unless_moved(key, names)
    follow_snapshot(key, names)
    follow_step(key, names)
    name = st.sidebar.select_slider("snapshot", names, key=key, help=FOLLOWS_NEWEST) \
        if len(names) > 1 else names[0]
    return Selection(chosen, snaps[names.index(name)], pick_text(chosen, snaps[names.index(name)]), sources), sources


def follow_requests(sources: list[data.Source], typed: list[data.Source]) -> None:
    """Select what was just asked for, once per request: a newly typed path, or a `?run=NAME` link
    (the landing view's and the doctor's links); the user's own pick stands until the next one."""
    path = st.session_state.get("typed_path", "")
    if typed and st.session_state.get("typed_applied") != path:
        st.session_state["run"] = next(s.label for s in sources if s.path.resolve() == typed[0].path.resolve())
    st.session_state["typed_applied"] = path
    wanted = st.query_params.get("run")
    st.session_state["asked_run"] = wanted  # what the address named at the start of this load (Patching reads it)
    found = catalog.find(sources, wanted)
    if found is not None and st.session_state.get("linked_run") != wanted:
        st.session_state["run"] = found.label
        # said again: a page link into the default page (the Overview, once `?run=` is there) loses
        # its query in the browser's address; this write puts it back (reload and share keep the run)
        st.query_params["run"] = wanted
    st.session_state["linked_run"] = wanted


def follow_snapshot(key: str, names: list[str]) -> None:
    """A `&snapshot=NAME` link (a shared address, a reload) moves the snapshot slider, once per link."""
    wanted = st.query_params.get("snapshot")
    if wanted in names and st.session_state.get("linked_snapshot") != wanted:
        st.session_state[key] = wanted
    st.session_state["linked_snapshot"] = wanted


def follow_step(key: str, names: list[str]) -> None:
    """A `?step=N` link (the doctor's "see it on Attention at step N") moves the snapshot slider to
    the snapshot nearest step N, once per link; step_notice says on the page which one it is."""
    wanted = st.query_params.get("step")
    if wanted is None or st.session_state.get("linked_snapshot_step") == wanted:
        return
    st.session_state["linked_snapshot_step"] = wanted
    steps = {name: int(m.group()) for name in names if (m := re.search(r"\d+", name))}
    if not wanted.isdigit() or not steps:
        return
    nearest = min(steps, key=lambda name: (abs(steps[name] - int(wanted)), steps[name]))
    st.session_state[key] = nearest
    st.session_state["step_notice"] = (wanted, nearest, steps[nearest] == int(wanted))


def step_notice(selection: Selection) -> None:
    """Above a page opened by a `?step=N` link, while it shows the snapshot picked for it: which one."""
    notice = st.session_state.get("step_notice")
    if not notice or selection.snapshot is None:
        return
    step, name, exact = notice
    if st.query_params.get("step") == step and selection.snapshot.name == name:
        st.info(f"The link names step {step}: this page shows snapshot `{name}`, "
                + ("saved at that step." if exact else "the saved snapshot nearest it (none was saved at that step)."))


def picked() -> None:
    """The user chose a run in the sidebar: the link now names it (shareable, and no stale ?run=)."""
    st.query_params["run"] = st.session_state["run"]
    st.session_state["linked_run"] = st.session_state["run"]
    st.session_state["run_picked"] = True


def address(selection: Selection) -> None:
    """The address names what a run's page shows: `?run=` its run, `&snapshot=` its snapshot unless
    that is the latest (which a run still training moves on from). Said on every page load, as a
    page link in the sidebar drops the query; what is written here is no new request."""
    run, snapshot = selection.run.label, None
    snaps = [p.name for p in selection.run.snapshots()] if selection.snapshot is not None else []
    if snaps and selection.snapshot.name != snaps[-1]:
        snapshot = selection.snapshot.name
    if st.query_params.get("run") != run:
        st.query_params["run"] = run
    if st.query_params.get("snapshot") != snapshot:
        if snapshot is None:
            del st.query_params["snapshot"]
        else:
            st.query_params["snapshot"] = snapshot
    st.session_state["linked_run"], st.session_state["linked_snapshot"] = run, snapshot


def linked_sweep(sources: list[data.Source]) -> str | None:
    """The sweep a `?run=NAME` names when it names no run (`?run=sweep_qk_norm`, as the Sweeps
    table calls it): the Sweep page shows it."""
    wanted = st.query_params.get("run")
    if not wanted or catalog.find(sources, wanted) is not None:
        return None
    folders = st.session_state.get("sweeps") or []
    return wanted if wanted in {sweeps.label_of(f, folders) for f in folders} else None


def unknown_run(sources: list[data.Source]) -> None:
    """A `?run=` naming no run (nor a sweep) is said, with the runs there are, above the page."""
    wanted = st.query_params.get("run")
    if wanted and catalog.find(sources, wanted) is None and linked_sweep(sources) is None:
        st.warning(f"`?run={wanted}` names no run here, so it was ignored. Known runs: "
                   + ", ".join(f"`{s.label}`" for s in sources) + ".")


def main() -> None:
    st.set_page_config(page_title="scratchscope", layout="wide")
    selection, sources = sidebar()
    st.session_state["selection"], st.session_state["sources"] = selection, sources
    st.session_state["run_roots"] = run_roots()  # the landing view watches them for new runs
    unknown_run(sources)
    # the landing view stays the default page (served at the root), so that every other page keeps
    # its own path: a default Overview would be served at / only, and /overview would be "not found"
    pages = {name: st.Page(f"views/{name}.py", title=title, url_path=name, default=name == "home")
             for name, title in PAGES}
    shown = st.navigation(list(pages.values()))
    sweep = linked_sweep(sources)
    if sweep is not None:  # ?run=SWEEP on any page: that sweep's page
        st.switch_page(pages["sweep"], query_params={"sweep": sweep})
    if shown is pages["home"]:
        if catalog.find(sources, st.query_params.get("run")) is not None:  # /?run=NAME: that run's Overview
            st.session_state["linked_run"] = None  # followed there: a widget's pick does not outlive the switch
            st.switch_page(pages["overview"], query_params=st.query_params.to_dict())
    elif selection is not None:
        address(selection)
        if shown is not pages["dynamics"]:  # which reads ?step= for its own table
            step_notice(selection)
    shown.run()
    warm.model_stack()  # after the page is drawn: the import would hold up its first chart
