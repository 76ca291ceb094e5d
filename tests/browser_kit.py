"""What every browser test shares: `streamlit run app/main.py` on a free localhost port, Playwright
driving headless Chromium (Debian's /usr/bin/chromium), and a page opened and waited on until its
charts are drawn. Test modules import the fixtures they use (`from browser_kit import browser, ...`).

Screenshots go into a temporary folder; with SCRATCHSCOPE_REFRESH_SCREENSHOTS=1 into
docs/screenshots/, which the README shows, so that running the tests leaves the checkout clean."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS_SHOTS = REPO / "docs" / "screenshots"
REFRESH_ENV = "SCRATCHSCOPE_REFRESH_SCREENSHOTS"  # "1": the page tests rewrite the docs' screenshots
CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
PAGES = {"overview": ("Overview", 2), "attention": ("Attention", 6), "dynamics": ("Training dynamics", 5),
         "embeddings": ("Embeddings", 1), "lens": ("Logit lens", 2), "compare": ("Compare", 16),
         "patching": ("Patching", 2)}


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    """Where the page screenshots go: the docs' folder only on request."""
    return DOCS_SHOTS if os.environ.get(REFRESH_ENV) == "1" else tmp_path_factory.mktemp("screenshots")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def streamlit_server(script: Path, cwd: Path, env: dict[str, str], *args: str) -> Iterator[tuple[str, float]]:
    """`streamlit run script [args]` on a free localhost port: (url, the perf_counter() at which the
    process started) once it answers its health check, stopped after; a RuntimeError with the
    end of its output if it does not come up within two minutes. benchmarks/browser_timing.py
    times the app with it too."""
    port = free_port()
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as output:
        proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(script), "--server.headless", "true",
                                 "--server.port", str(port), "--server.address", "127.0.0.1",
                                 "--browser.gatherUsageStats", "false", *args],
                                cwd=cwd, env=env, stdout=output, stderr=subprocess.STDOUT, text=True)
        url = f"http://127.0.0.1:{port}"
        try:
            while not _healthy(url):
                if proc.poll() is not None or time.perf_counter() - started > 120:
                    output.seek(0)
                    raise RuntimeError(f"streamlit run {script} did not come up: {output.read()[-2000:]}")
                time.sleep(0.02)
            yield url, started
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def _healthy(url: str) -> bool:
    try:
        return urllib.request.urlopen(f"{url}/_stcore/health", timeout=1).status == 200
    except OSError:
        return False


@contextmanager
def serve(env: dict[str, str] | None = None) -> Iterator[str]:
    """`streamlit run app/main.py` on a free localhost port (extra environment from `env`)."""
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium")
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    running = ExitStack()
    try:  # a server that does not start fails the test; errors inside the test stay its own
        url, _ = running.enter_context(streamlit_server(REPO / "app" / "main.py", REPO,
                                                        {**os.environ, **(env or {})}))
    except RuntimeError as exc:
        pytest.fail(str(exc))
    with running:
        yield url


@pytest.fixture(scope="module")
def server():
    with serve() as url:
        yield url


@contextmanager
def chromium() -> Iterator:
    """Playwright's headless Debian Chromium, closed after."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(scope="module")
def browser():
    with chromium() as launched:
        yield launched


def open_page(browser, url: str, name: str, run: str = "shakespeare_rms4"):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    path = "" if name == "overview" else name  # the default page lives at the root
    page.goto(f"{url}/{path}?run={run}", timeout=120_000)
    page.wait_for_selector('[data-testid="stApp"]', timeout=120_000)
    title, charts = PAGES[name]
    page.get_by_role("heading", name=title).first.wait_for(timeout=120_000)
    page.wait_for_function(
        f"document.querySelectorAll('[data-testid=\"stVegaLiteChart\"] canvas, "
        f"[data-testid=\"stVegaLiteChart\"] svg').length >= {charts}", timeout=120_000)
    page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=120_000)
    page.wait_for_timeout(800)  # let vega finish drawing before the screenshot
    assert page.locator('[data-testid="stException"]').count() == 0
    return page


def photograph(page, path: Path, most: int = 3600) -> None:
    """A screenshot of the whole page: Streamlit scrolls inside its main section, so Playwright's
    full_page sees one screen; the window is first made as tall as the page (at most `most` px)."""
    height = page.evaluate("""() => { const main = document.querySelector('[data-testid="stMain"]');
                                      return main ? main.scrollHeight : document.body.scrollHeight; }""")
    page.set_viewport_size({"width": page.viewport_size["width"], "height": max(900, min(most, height))})
    page.wait_for_timeout(1500)  # charts stretched to the column redraw at the new size
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=True)

