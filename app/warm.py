"""Imports done ahead of need, in background threads, so that a page does not wait for them; and
the one pause that keeps them from holding up the first chart.

One interpreter lock is shared by the script that draws a page and the server that answers the
browser (its JavaScript, the chart library it fetches when the first chart arrives). An import
holds that lock in long stretches, so while one runs the browser waits (bench_app.py measures it):
- `chart_stack` (pandas, Altair, the pages) runs once when the server starts (app/main.py's
  `st.App` start-up hook), while the browser is still loading Streamlit's own page;
- `model_stack` (torch, TransformerLens through our models, the probes: ~4 s) runs after a page is
  drawn, and `before_first_model` gives the browser a moment before a page imports it itself (a
  model page draws its first chart from the snapshot's saved first view, then loads the model).
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

CHART_MODULES = ("pandas", "altair", "app.charts", "app.views.home", "app.views.overview", "app.views.dynamics",
                 "app.views.attention", "app.views.embeddings", "app.views.lens", "app.views.compare",
                 "app.views.tuned")
MODEL_MODULES = ("torch", "models.checkpoint", "models.transformer", "models.sample", "probes.page_view",
                 "probes.degenerate", "probes.entropy", "probes.heads", "probes.logit_lens", "probes.neighbours",
                 "probes.projection", "probes.updates")
# how long the first model load waits after a page sent its charts: the browser fetches Vega (~1 MB)
# from this server and draws (~0.6 s here); the import would slow the fetch to ~1.5 s
BROWSER_MOMENT_S = 0.6

_started: dict[str, threading.Thread] = {}


def _import_all(names: tuple[str, ...], then: Callable[[], None] | None) -> None:
    try:
        for name in names:
            importlib.import_module(name)
        if then is not None:
            then()
    except Exception:  # noqa: BLE001 - the page that needs the module imports it again and says why
        logging.getLogger(__name__).debug("warming the imports failed", exc_info=True)


def _first_chart() -> None:
    """Altair loads and compiles the Vega-Lite schema on its first chart (~80 ms): here, not in a page."""
    import altair as alt
    import pandas as pd

    alt.Chart(pd.DataFrame({"step": [0, 1], "loss": [1.0, 0.5]})).mark_line().encode(x="step", y="loss").to_dict()


def _in_background(name: str, modules: tuple[str, ...], then: Callable[[], None] | None = None) -> threading.Thread:
    """Import `modules` (then call `then`) in a daemon thread, once per process."""
    if name not in _started:
        _started[name] = threading.Thread(target=_import_all, args=(modules, then), daemon=True,
                                          name=f"scratchscope-warm-{name}")
        _started[name].start()
    return _started[name]


def chart_stack() -> threading.Thread:
    return _in_background("charts", CHART_MODULES, then=_first_chart)


def model_stack() -> threading.Thread:
    return _in_background("models", MODEL_MODULES)


def before_first_model() -> None:
    """Called by a page that has sent charts and is about to load a model: in a server that has not
    started importing torch, wait BROWSER_MOMENT_S so that the browser fetches the chart library and
    draws them before the import takes the interpreter lock (the Overview's first chart, cold: 4.6 s
    without the wait, 3.6 s with it). Any later load finds torch imported and does not wait."""
    if "torch" not in sys.modules:
        time.sleep(BROWSER_MOMENT_S)


@asynccontextmanager
async def at_server_start(_app: Any) -> AsyncIterator[None]:
    """`st.App`'s lifespan: warm the chart stack while the browser loads Streamlit's page, and give
    the server's stop signals their deadline (app/stop.py)."""
    from app.stop import with_deadline

    with_deadline()
    chart_stack()
    yield
