"""Opening the app in AppTest as the app tests do: caches cleared (they outlive an AppTest), the
app on the given run roots only (or the shipped runs when none), `?key=value` in its address, run
once, then switched to a page, with no exception on the way."""

from __future__ import annotations

import os
from pathlib import Path

APP = Path(__file__).resolve().parent.parent / "app" / "main.py"


def open_app(monkeypatch, roots: list[Path] | None = None, page: str | None = None, timeout: int = 180,
             **query: str):
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    st.cache_data.clear()
    st.cache_resource.clear()
    if roots is not None:
        monkeypatch.setenv("SCRATCHSCOPE_RUNS", os.pathsep.join(str(r) for r in roots))
        monkeypatch.setenv("SCRATCHSCOPE_NO_SHIPPED", "1")
    at = AppTest.from_file(str(APP), default_timeout=timeout)
    at.query_params.update(query)
    at.run()
    if page not in (None, "overview"):  # ?run= opens a run's Overview
        at.switch_page(f"views/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at
