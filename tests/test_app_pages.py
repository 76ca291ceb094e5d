"""The views are the pages: the navigation runs each page's file in app/views/ (no app/screens/
holding a copy of the call), with its address and title; imported as a module a view draws nothing
(app/warm.py imports them at server start, tests import `render`), run as `__main__` it draws."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "app" / "main.py"
NO_CONTEXT = "missing ScriptRunContext"  # what Streamlit logs when something draws outside a page run


def bare_python(code: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter with no Streamlit script run around it."""
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_every_page_is_a_view_file_with_its_address_and_title(monkeypatch, tmp_path):
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from app.views.common import PAGES

    made = []
    real_page = st.Page

    def recorded_page(page, **kwargs):
        made.append((page, kwargs["url_path"], kwargs["title"]))
        return real_page(page, **kwargs)

    monkeypatch.setattr(st, "Page", recorded_page)
    monkeypatch.setenv("SCRATCHSCOPE_RUNS", str(tmp_path))  # no runs: each page is its title and a note
    monkeypatch.setenv("SCRATCHSCOPE_NO_SHIPPED", "1")
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()
    assert not (ROOT / "app" / "screens").exists()
    assert made == [(f"views/{name}.py", name, title) for name, title in PAGES]
    assert all((APP.parent / path).is_file() for path, _, _ in made)
    assert [t.value for t in at.main.title] == ["Runs"]  # the landing view is the default page
    for name, title in PAGES[1:]:
        at.switch_page(f"views/{name}.py").run()
        assert not at.exception, [e.value for e in at.exception]
        assert [t.value for t in at.main.title] == [title], name


def test_a_view_imported_draws_nothing_and_run_as_main_draws():
    from app.views.common import PAGES

    names = [name for name, _ in PAGES]
    imported = bare_python("import importlib\n" + "".join(f"importlib.import_module('app.views.{n}')\n" for n in names))
    assert imported.returncode == 0, imported.stderr
    assert NO_CONTEXT not in imported.stderr
    ran = bare_python("import runpy; runpy.run_path('app/views/home.py', run_name='__main__')")
    assert ran.returncode == 0, ran.stderr
    assert NO_CONTEXT in ran.stderr  # the check above can see a page drawing
