"""What every page shares: the sidebar's selection and the error box that replaces a traceback."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import streamlit as st

from app import data, run_files
from app.logs import foreign_log, history_only

# (url_path, title) of each page; app/shell.py builds the navigation from views/<url_path>.py
PAGES = [("home", "Runs"), ("overview", "Overview"), ("attention", "Attention"), ("dynamics", "Training dynamics"),
         ("embeddings", "Embeddings"), ("lens", "Logit lens"), ("development", "Development"),
         ("patching", "Patching"), ("compare", "Compare"), ("sweep", "Sweep")]


@dataclass
class Selection:
    run: data.Source  # the run (or lone snapshot) picked in the sidebar
    snapshot: Path | None  # the snapshot picked in the sidebar; None: a run that saved no weights
    text: str  # the text to probe
    sources: list[data.Source]  # every run the app knows, for Compare

    @property
    def key(self) -> tuple[str, float, str | None]:
        """(path, mtime, preset): what the cached probe calls are keyed by."""
        return str(self.snapshot), data.mtime(self.snapshot), self.run.preset


def current() -> Selection | None:
    """The selection app/main.py made from the sidebar in this script run."""
    return st.session_state.get("selection")


HISTORY_ONLY = ("This run holds its training history only: no snapshot is in its folder. The Overview, "
                "Training dynamics and Compare show the history; the pages that read the model need a snapshot: ")


def no_weights_text(run_dir: Path) -> str:
    """Why a run has no snapshot and how to get one, in the words of what made it (its run.json):
    the Monitor saves none without `save_every`; `python -m train` saves one at the end even with
    `--save-every 0`, so a run it made had its snapshots removed (the shipped sweep keeps histories)."""
    if run_dir.is_file():  # a training log opened by itself (nanoGPT's printed log, trainer_state.json)
        return ("This is a training log: its history only. The Overview shows the run doctor's reading of it "
                "and its loss curves; the pages that read the model need a checkpoint.")
    found = foreign_log(run_dir)
    if found is not None and history_only(run_dir):  # llm.c's -o folder: main.log beside weights we do not read
        return (f"This folder holds another trainer's log ({found[1].name}) and no checkpoint that scratchscope "
                "reads: its history only. The Overview shows the run doctor's reading of it and its loss curves; "
                "the pages that read the model need a checkpoint.")
    info = run_files.run_info(run_dir)  # {} for a damaged run.json: then the general advice
    command = info.get("command") if isinstance(info.get("command"), str) else ""
    if info.get("source") == "monitor":
        return HISTORY_ONLY + ("give the Monitor `save_every=N` (and `tokenizer=`; `eval_tokens=` too for a model "
                               "of your own) and train again.")
    if command.startswith("python -m train"):
        return HISTORY_ONLY + ("`python -m train` saves one at the end even with `--save-every 0`, so this "
                               "run's were removed (the shipped sweep keeps its runs' histories only, to stay "
                               f"small). Train it again with its own command (run.json): `{command}`")
    return HISTORY_ONLY + "train it with `python -m train`, or give a Monitor `save_every=N`."


def page(title: str, question: str, needs_model: bool = True) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A page body: title and question, nothing without a selection (nor, for a page that reads
    the model, without a snapshot), and an error box (never a traceback) for bad input: a missing
    or corrupt checkpoint, a model without attention, an empty text, a character the vocabulary
    lacks."""
    def wrap(body: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(body)
        def render(selection: Selection | None, *args: Any) -> None:
            st.title(title)
            st.caption(question)
            if selection is None:
                st.info("Choose a run in the sidebar.")
                return
            if needs_model and selection.snapshot is None:
                st.info(no_weights_text(selection.run.path))
                return
            try:
                body(selection, *args)
            except Exception as exc:  # noqa: BLE001 - the page shows it; the app keeps working
                st.error(error_text(exc))
        return render
    return wrap


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


SAID = (ValueError, OSError, RuntimeError)  # bad input or files: their message is the whole story


def error_text(exc: BaseException) -> str:
    """What an error box says: the message in our words, never led by a Python class name
    ("ProbeInputError: ..."); an error of another kind (a bug) says so after its message."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, SAID) and text:
        return text  # as written: it may start with a path, which must keep its case
    return f"{text or 'Something went wrong'} (an unexpected {type(exc).__name__}: please report it)"


def show(chart: Any, where: Any = None, stretch: bool = False, **select: Any) -> Any:
    """Draw an Altair chart whose width/height mean the plot area (legends and titles come on top),
    stretched to the column for line charts and for a chart of width "container" (a grid with too
    many positions for its own size), at its own size for grids and heatmaps. `select` (key,
    on_select, selection_mode) makes a chart with a selection an input; its state is returned."""
    import altair as alt

    stretch = stretch or getattr(chart, "width", None) == "container"

    autosize = alt.AutoSizeParams(type="fit-x" if stretch else "pad", contains="padding")
    return (where or st).altair_chart(chart.properties(autosize=autosize), width="stretch" if stretch else "content",
                                      **select)


SCROLL = """<script>(() => {  // bring the heading into view while the charts above it draw, until the user scrolls
  let tries = 0;
  const stop = () => { tries = 1e9; };
  ["wheel", "touchmove", "keydown"].forEach(e => window.addEventListener(e, stop, {once: true}));
  const go = () => {
    const h = [...document.querySelectorAll("h1, h2, h3")].find(e => e.textContent.startsWith(%s));
    if (h) h.scrollIntoView({block: "start"});
    if (++tries < 20) setTimeout(go, 300);
  };
  go();
})();</script>"""


def scroll_to(heading: str) -> None:
    """Scroll the page to the heading starting with `heading` (a link that names what lies below the top)."""
    st.html(SCROLL % json.dumps(heading), unsafe_allow_javascript=True)


def saved_note(snap: Any) -> None:
    """One line above a page drawn from what a snapshot of any model saved (no code to run it)."""
    if not data.saved_only(snap):
        return
    name, readings = snap.config.architecture, snap.meta.get("readings") or {}
    st.info(f"This snapshot of a {name} was saved without its code: the page shows what was read from it at "
            f"step {snap.step} on row 0 of its saved sample ({readings.get('positions')} of its eval tokens), "
            f"not the sidebar's text. To read any text, start the app with `-- --model-code "
            f"path/to/your_file.py:{name}` (the app then runs that code).")


def has_attention(snap: Any) -> bool:
    return getattr(snap.config, "family", "") == "transformer"
