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
from app.views.common import PAGES

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
from app.views.common import PAGES

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


def test_the_server_starts_the_model_imports_when_a_model_page_is_asked_for(monkeypatch):
    """A browser's request for Attention, Embeddings or Logit lens (under a base URL too) starts the
    model imports at once; the run list, the history pages, Streamlit's own files and its
    websocket do not; every request goes on to the server unchanged."""
    import asyncio

    started, passed = [], []
    monkeypatch.setattr(warm, "model_stack", lambda: started.append(True))

    async def server(scope, receive, send):
        passed.append(scope["path"])

    middleware = warm.ModelPagesFirst(server)
    asked = {"/attention": True, "/embeddings": True, "/base/lens/": True, "/": False, "/dynamics": False,
             "/compare": False, "/static/js/index.js": False, "/_stcore/health": False}
    for path, starts in asked.items():
        started.clear()
        asyncio.run(middleware({"type": "http", "path": path}, None, None))
        assert bool(started) is starts, path
    started.clear()
    asyncio.run(middleware({"type": "websocket", "path": "/attention"}, None, None))
    assert started == []
    assert passed == [*asked, "/attention"]
    assert warm.MODEL_FIRST_PAGES <= {name for name, _ in PAGES}  # url paths the navigation has


def test_the_app_serves_through_the_middleware():
    out = subprocess.run([sys.executable, "-c", "import runpy; from app import warm; "
                          f"app = runpy.run_path({str(APP)!r}, run_name='main')['streamlit_app']; "
                          "print([m.cls.__name__ for m in app._user_middleware])"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['ModelPagesFirst']"
