"""The app in a real browser: `streamlit run app/main.py` on a free localhost port, driven by
Playwright in headless Chromium (Debian's /usr/bin/chromium), every page opened on the shipped
runs, a screenshot of each taken (into a temporary folder; with SCRATCHSCOPE_REFRESH_SCREENSHOTS=1
into docs/screenshots/, which the README shows, so that running the tests leaves the checkout clean)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parent.parent
DOCS_SHOTS = REPO / "docs" / "screenshots"
REFRESH_ENV = "SCRATCHSCOPE_REFRESH_SCREENSHOTS"  # "1": the page tests rewrite the docs' screenshots
CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
PAGES = {"overview": ("Overview", 2), "attention": ("Attention", 3), "dynamics": ("Training dynamics", 5),
         "embeddings": ("Embeddings", 1), "lens": ("Logit lens", 2), "compare": ("Compare", 3)}


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    """Where the page screenshots go: the docs' folder only on request."""
    return DOCS_SHOTS if os.environ.get(REFRESH_ENV) == "1" else tmp_path_factory.mktemp("screenshots")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve(env: dict[str, str] | None = None) -> Iterator[str]:
    """`streamlit run app/main.py` on a free localhost port (extra environment from `env`)."""
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium")
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app/main.py", "--server.headless", "true",
         "--server.port", str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).status == 200:
                    break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("streamlit did not come up: " + (proc.stdout.read() if proc.poll() is not None else ""))
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def server():
    with serve() as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


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


@pytest.mark.parametrize("name", list(PAGES))
def test_every_page_renders_its_charts_and_is_photographed(server, browser, shots, name):
    page = open_page(browser, server, name)
    shots.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(shots / f"{name}.png"), full_page=True)
    assert (shots / f"{name}.png").stat().st_size > 10_000
    page.close()


def test_picking_another_head_changes_the_heatmap(server, browser):
    page = open_page(browser, server, "attention")
    heatmap = page.locator('[data-testid="stVegaLiteChart"]').nth(1)
    before = heatmap.screenshot()
    page.get_by_text("L0H0:", exact=False).first.wait_for()
    box = page.locator('[data-testid="stSelectbox"]').filter(has_text="head")
    options = page.get_by_role("option")
    for _ in range(5):  # the first click can land while the page is still settling
        box.scroll_into_view_if_needed()
        box.get_by_role("combobox").click()
        page.wait_for_timeout(500)
        if options.count():
            break
    options.first.wait_for(timeout=30_000)
    texts = [options.nth(i).inner_text().strip() for i in range(options.count())]
    options.nth(texts.index("2")).click()
    page.get_by_text("L0H2:", exact=False).first.wait_for(timeout=60_000)
    deadline = time.time() + 60
    while time.time() < deadline:  # vega redraws a moment after the page text changes
        page.wait_for_timeout(500)
        after = page.locator('[data-testid="stVegaLiteChart"]').nth(1).screenshot()
        if after != before:
            break
    assert after != before, "the heatmap did not change after picking head 2"
    page.close()


def test_a_collapsed_run_shows_its_verdict_and_an_mlp_run_an_info_box(server, browser):
    page = open_page(browser, server, "attention", run="attn1_noscale")
    assert page.get_by_text("collapsed").count() >= 1
    page.close()
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{server}/attention?run=char_mlp", timeout=120_000)
    page.locator('[data-testid="stAlertContentInfo"]').first.wait_for(timeout=120_000)
    assert "no attention heads" in page.locator('[data-testid="stAlertContentInfo"]').first.inner_text()
    assert page.locator('[data-testid="stAlertContentError"]').count() == 0  # not applicable is not an error
    page.close()


def test_the_app_opens_on_the_landing_view_and_a_link_opens_a_run(server, browser, shots):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(server, timeout=120_000)
    page.get_by_role("heading", name="Runs").first.wait_for(timeout=120_000)
    page.locator('[data-testid="stDataFrame"]').first.wait_for(timeout=120_000)
    page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=120_000)
    page.wait_for_timeout(800)
    assert page.locator('[data-testid="stException"]').count() == 0
    links = page.locator('[data-testid="stPageLink"]')
    assert links.count() == len([p for p in (REPO / "checkpoints").iterdir() if p.is_dir()])
    shots.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(shots / "home.png"), full_page=True)
    links.filter(has_text="transformer4_nan").first.click()
    page.get_by_role("heading", name="Overview").first.wait_for(timeout=120_000)
    verdict = page.locator('[data-testid="stAlertContentError"]').filter(has_text="Verdict")
    verdict.first.wait_for(timeout=120_000)
    assert "Verdict: failed" in verdict.first.inner_text()
    page.close()


def test_an_unknown_run_in_the_address_is_a_warning_on_the_landing_view(server, browser):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{server}/?run=nosuch", timeout=120_000)
    warning = page.locator('[data-testid="stAlertContentWarning"]').filter(has_text="nosuch")
    warning.first.wait_for(timeout=120_000)
    assert "shakespeare_rms4" in warning.first.inner_text()
    assert page.get_by_role("heading", name="Runs").count() >= 1
    page.close()


def test_the_overview_opens_with_the_run_doctors_verdict(server, browser):
    page = open_page(browser, server, "overview", run="transformer4_nan")
    verdict = page.locator('[data-testid="stAlertContentError"]').filter(has_text="Verdict")
    verdict.first.wait_for(timeout=60_000)
    assert "Verdict: failed" in verdict.first.inner_text()
    assert page.get_by_text("the run diverged", exact=False).count() >= 1  # the divergence finding
    assert page.get_by_text("see it on Training dynamics", exact=False).count() >= 1
    page.close()



def test_a_folder_of_nanogpt_checkpoints_opens_in_the_browser(browser, tmp_path):
    """A user's nanoGPT out_dir (numbered ckpt files and its meta.pkl) is a run in the app."""
    import torch
    from nanogpt_ref import GPT, GPTConfig, save_like_nanogpt, write_meta_pkl

    runs = tmp_path / "runs"
    (runs / "nano").mkdir(parents=True)
    for step in (100, 200):
        torch.manual_seed(step)
        save_like_nanogpt(GPT(GPTConfig(block_size=32)).eval(), runs / "nano" / f"ckpt_{step:06d}.pt",
                          iter_num=step)
    write_meta_pkl(runs / "nano" / "meta.pkl", "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
    with serve({"SCRATCHSCOPE_RUNS": str(runs), "SCRATCHSCOPE_NO_SHIPPED": "1"}) as url:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{url}/overview?run=nano", timeout=120_000)
        page.get_by_role("heading", name="Overview").first.wait_for(timeout=120_000)
        page.get_by_text("tokens seen").first.wait_for(timeout=120_000)  # the model loaded
        page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=120_000)
        assert page.locator('[data-testid="stException"]').count() == 0
        assert page.get_by_text("ckpt_000200.pt").count() >= 1  # its latest checkpoint is the snapshot shown
        page.close()
