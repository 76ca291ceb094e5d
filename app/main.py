"""scratchscope: look at a run. `streamlit run app/main.py` (add `-- --runs DIR ...` for your own).

Runs come from `checkpoints/` (the shipped story), every `--runs DIR` after `--`, and the
`SCRATCHSCOPE_RUNS` environment variable (os.pathsep-separated; tests use it). The sidebar picks
a run, one of its snapshots and the text to probe; each page answers one question.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # streamlit runs this file as a script: make the packages importable
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

from app import data  # noqa: E402
from app.views.common import PAGES, Selection  # noqa: E402


def run_roots() -> list[Path]:
    parser = argparse.ArgumentParser(prog="streamlit run app/main.py --")
    parser.add_argument("--runs", nargs="+", type=Path, default=[],
                        help="run directories, or folders holding runs (the shipped ones are always listed)")
    args, _ = parser.parse_known_args(sys.argv[1:])
    env = [Path(p) for p in os.environ.get("SCRATCHSCOPE_RUNS", "").split(os.pathsep) if p]
    shipped = [] if os.environ.get("SCRATCHSCOPE_NO_SHIPPED") else [ROOT / "checkpoints"]
    return [*args.runs, *env, *shipped]


def typed_source() -> data.Source | None:
    """A path typed in the sidebar: a snapshot, a run, a nanoGPT ckpt.pt (or a folder of them), a
    Hugging Face GPT-2 directory, or a series .pt with a preset."""
    with st.sidebar.expander("Open a path"):
        path = st.text_input("snapshot, run, nanoGPT ckpt.pt, Hugging Face GPT-2 directory or .pt file",
                             key="typed_path")
        preset = st.text_input("preset (for a .pt state dict)", key="typed_preset")
    if not path:
        return None
    source = Path(path).expanduser()
    if not source.exists():
        st.sidebar.error(f"{source} does not exist")
        return None
    return data.Source(source, preset or None)


def pick_text(run: data.Source) -> str:
    st.sidebar.markdown("**Text to probe**")
    corpus = data.data_file(run.path) if run.is_run else None
    if run.is_run and corpus is None and data.recorded_data(run.path):
        st.sidebar.caption(f"The run's data file {data.recorded_data(run.path)} is not here, "
                           "so random passages are off.")
    if corpus is not None and st.sidebar.button("Random passage from the run's data", width="stretch"):
        st.session_state["seed"] = st.session_state.get("seed", 0) + 1
        st.session_state["text"] = data.random_passage(corpus, 240, st.session_state["seed"])
    return st.sidebar.text_area("text", value=st.session_state.get("text", data.DEFAULT_TEXT), height=140,
                                key="text", label_visibility="collapsed",
                                help="the first context window of this text is probed")


def sidebar() -> Selection | None:
    st.sidebar.title("scratchscope")
    sources = data.discover(run_roots())
    typed = typed_source()
    if typed is not None:
        sources = [typed, *sources]
    if not sources:
        st.sidebar.error("No runs found: pass `-- --runs DIR` or type a path above.")
        return None
    labels = [s.label for s in sources]
    wanted = st.query_params.get("run")  # ?run=NAME picks a run from a link
    index = labels.index(wanted) if wanted in labels else 0
    chosen = sources[labels.index(st.sidebar.selectbox("run", labels, index=index, key="run"))]
    snaps = chosen.snapshots()
    if not snaps:
        st.sidebar.error(f"{chosen.path} holds no snapshots")
        return None
    names = [p.name for p in snaps]
    name = st.sidebar.select_slider("snapshot", names, value=names[-1], key=f"snap:{chosen.path}") \
        if len(names) > 1 else names[0]
    return Selection(chosen, snaps[names.index(name)], pick_text(chosen), sources)


def main() -> None:
    st.set_page_config(page_title="scratchscope", layout="wide")
    st.session_state["selection"] = sidebar()
    pages = [st.Page(f"screens/{name}.py", title=title, url_path=name, default=name == "overview")
             for name, title in PAGES]
    st.navigation(pages).run()


main()
