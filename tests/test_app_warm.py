"""The app's start-up work (app/warm.py, app/main.py): `streamlit run app/main.py` finds an
`st.App` whose start-up hook imports the charting stack, and not torch; the script itself still
runs as `__main__` (AppTest, every page load); the first model load waits for the browser only
in a server that has not imported torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch  # noqa: F401 - this process plays a server that has imported torch
from streamlit.web.server.app_discovery import discover_asgi_app

from app import warm

REPO = Path(__file__).resolve().parent.parent
APP = REPO / "app" / "main.py"


def test_streamlit_run_finds_the_app_with_its_start_up_hook():
    found = discover_asgi_app(APP)  # what `streamlit run app/main.py` does before it serves anything
    assert found.is_asgi_app and found.app_name == "streamlit_app"
    out = subprocess.run([sys.executable, "-c", "import runpy; from app import warm; "
                          f"app = runpy.run_path({str(APP)!r}, run_name='main')['streamlit_app']; "
                          "print(type(app).__name__, app._user_lifespan is warm.at_server_start)"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["App", "True"]


WARM_AT_START = """
import asyncio, sys
from app import warm

async def serve():
    async with warm.at_server_start(None):
        warm.chart_stack().join(120)

asyncio.run(serve())
print(" ".join(m for m in (*warm.CHART_MODULES, "torch", "transformer_lens") if m in sys.modules))
"""


def test_the_start_up_hook_imports_the_chart_stack_and_not_torch():
    out = subprocess.run([sys.executable, "-c", WARM_AT_START], cwd=REPO, capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == list(warm.CHART_MODULES)  # all of them; torch would hold up the page


def test_the_first_model_load_waits_only_in_a_server_without_torch(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(warm.time, "sleep", slept.append)
    warm.before_first_model()  # this process has imported torch: no wait
    assert slept == []
    monkeypatch.delitem(sys.modules, "torch")
    warm.before_first_model()
    assert slept == [warm.BROWSER_MOMENT_S]
