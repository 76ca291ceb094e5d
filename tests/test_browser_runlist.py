"""The run list and the Sweep page at 1280 px tell a sweep's runs apart (issue 38, item 2): before,
the sidebar's run box and the "Open a run" links showed `sweep_qk_norm/lr=1e-03,` for two runs,
their `none` / `rms` cut off, and the run list linked every sweep run. Now the run list holds one
row per sweep with its runs folded under it, every link's text is drawn whole, the run box shows a
sweep run's own name whole (what its sweep's runs share may be cut after it), and `?run=SWEEP`
opens the Sweep page.

A link's text is cut where it reaches past the right edge of an ancestor that hides its overflow
(the column, an ellipsis): the check measures the text's own box with a DOM Range. The run box is
an input: its text is measured in the input's own font against the input's room.

Issue 44: the run list's cells are drawn whole at 1280 px (before: 'transformer 4L×4H d…', '4 failed,
4 w…'), and the app run as the README says shows no Deploy button and prints no usage-statistics
notice (app/.streamlit/config.toml)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
from browser_kit import REPO, _healthy, browser, free_port, serve  # noqa: F401 - fixtures

pytestmark = [pytest.mark.browser, pytest.mark.slow]

BOOK = json.loads((REPO / "checkpoints" / "sweep_qk_norm" / "sweep.json").read_text())
NAMES = sorted(r["dir"] for r in BOOK["runs"])

CUT = """([selector, chars]) => [...document.querySelectorAll(selector)].filter(e => e.offsetParent).flatMap(root => {
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  const out = [];
  while (walker.nextNode()) {
    const node = walker.currentNode, text = node.textContent;
    if (!text.trim()) continue;
    const range = document.createRange();
    range.setStart(node, 0);
    range.setEnd(node, chars > 0 ? Math.min(chars, text.length) : text.length);
    let edge = Infinity;
    for (let p = node.parentElement; p && p !== document.body; p = p.parentElement) {
      const style = getComputedStyle(p);
      if (style.overflowX !== 'visible' || style.textOverflow === 'ellipsis' || p.dataset.testid === 'stColumn')
        edge = Math.min(edge, p.getBoundingClientRect().right);
    }
    if (range.getBoundingClientRect().right > edge + 1) out.push(text);
  }
  return out;
})"""
LINK = '[data-testid="stPageLink"]'


@pytest.fixture(scope="module")
def app():
    with serve({"SCRATCHSCOPE_RUNS": str(REPO / "checkpoints"), "SCRATCHSCOPE_NO_SHIPPED": "1"}) as url:
        yield url


def opened(browser, url: str, heading: str, ready: str = "[data-testid=\"stMain\"] [data-testid=\"stPageLink\"]"):  # noqa: F811
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(url, timeout=120_000)
    page.get_by_role("heading", name=heading).first.wait_for(timeout=120_000)
    if ready:
        page.wait_for_selector(ready, timeout=120_000)
    page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=120_000)
    page.wait_for_timeout(1000)
    assert page.locator('[data-testid="stException"]').count() == 0
    return page


def link_texts(page, within: str = "") -> list[str]:
    """The visible links' texts (their icon's ligature name left out)."""
    return page.evaluate(f"() => [...document.querySelectorAll('{within} {LINK}')].filter(e => e.offsetParent)"
                         ".map(e => e.innerText.trim().split('\\n').pop().trim())")


def test_the_run_list_folds_the_sweep_and_draws_every_link_whole(browser, app):  # noqa: F811
    page = opened(browser, app, "Runs")
    before = link_texts(page)
    assert "attn1_noscale" in before and "Sweep sweep_qk_norm" in before
    assert not any("qk_norm=" in text for text in before)  # folded: no sweep run among them
    page.get_by_text("sweep_qk_norm: its 14 runs").click()
    page.wait_for_timeout(800)
    runs = link_texts(page, '[data-testid="stExpander"]')
    assert sorted(runs) == NAMES  # each sweep run once, by its own name
    assert page.evaluate(CUT, ['[data-testid="stMain"] ' + LINK, 0]) == []
    page.close()


ROOM = """([box, texts]) => {  // the box's input: its value, its room for text, each text's drawn width
  const input = document.querySelector(box + ' input'), style = getComputedStyle(input);
  const pen = document.createElement('canvas').getContext('2d');
  pen.font = style.font;
  const room = input.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  return [input.value, room, texts.map(t => pen.measureText(t).width)];
}"""


def test_the_run_box_shows_a_sweep_runs_own_name_whole(browser, app):  # noqa: F811
    box = '[data-testid="stSidebar"] [data-testid="stSelectbox"]'
    for name in ("lr=1e-03,qk_norm=none", "lr=1e-03,qk_norm=rms"):
        page = opened(browser, f"{app}/dynamics?run=sweep_qk_norm/{name}", "Training dynamics", ready=box)
        old = f"sweep_qk_norm/{name}"  # what the box showed before
        value, room, (own, before) = page.evaluate(ROOM, [box, [name, old]])
        assert value == f"{name} · sweep_qk_norm"
        assert own <= room < before  # its own name fits; the old label did not (its none / rms were cut)
        page.close()


def test_the_sweep_pages_links_are_whole_and_run_equals_sweep_opens_it(browser, app):  # noqa: F811
    page = opened(browser, f"{app}/?run=sweep_qk_norm", "Sweep")
    assert "sweep=sweep_qk_norm" in page.url
    links = [text for text in link_texts(page, '[data-testid="stMain"]') if "=" in text]
    assert sorted(links) == NAMES
    assert page.evaluate(CUT, ['[data-testid="stMain"] ' + LINK, 0]) == []
    page.close()


CELLS = """() => {  // the run list's cells: [column, text, drawn width, room] for each
  const grid = document.querySelector('[data-testid="stMain"] [data-testid="stDataFrame"]');
  const canvas = grid.querySelector('[data-testid="data-grid-canvas"]');
  // the grid draws its cells on a canvas: its columns' drawn widths and its fonts are the props that
  // React gave the grid (found up its fiber), and each cell's text is in its accessibility table
  const fiber = Object.keys(canvas).find(k => k.startsWith('__reactFiber'));
  let columns = null, theme = null;
  for (let f = canvas[fiber]; f && !(columns && theme); f = f.return) {
    const props = f.memoizedProps || {};
    if (!columns && Array.isArray(props.columns) && props.columns.length && typeof props.columns[0].width === 'number')
      columns = props.columns;
    if (!theme && props.theme && props.theme.baseFontStyle) theme = props.theme;
  }
  const pen = document.createElement('canvas').getContext('2d');
  const size = theme.baseFontStyle.split(' ').pop();
  const out = [...grid.querySelectorAll('[data-testid^="glide-cell-"]')].map(cell => {
    const [c] = cell.dataset.testid.split('-').slice(2).map(Number);
    const column = columns[c], text = cell.textContent;
    pen.font = `${['state', 'doctor'].includes(column.title) ? 700 : 400} ${size} ${theme.fontFamily}`;  // verdicts: bold
    return [column.title, text, pen.measureText(text).width, column.width - 2 * theme.cellHorizontalPadding];
  });
  return [out, columns.reduce((sum, c) => sum + c.width, 0), canvas.getBoundingClientRect().width];
}"""


def test_the_run_lists_model_state_and_doctor_cells_are_drawn_whole_at_1280px(browser, app):  # noqa: F811
    page = opened(browser, app, "Runs", ready='[data-testid="stMain"] [data-testid="stDataFrame"]')
    page.evaluate("document.fonts.ready")
    cells, drawn, room = page.evaluate(CELLS)
    assert drawn <= room + 1  # every column in view: none pushed past the table's right edge
    shown = [(column, text) for column, text, _, _ in cells]
    assert ("doctor", "failed") in shown and ("state", "4/14 diverged") in shown and ("snapshots", "0") in shown
    assert {"run", "model", "val loss", "state", "doctor"} <= {column for column, _ in shown}
    cut = [(column, text, round(width), room) for column, text, width, room in cells if width > room]
    assert cut == [], cut  # before: 'transformer 4L×4H d…', '4 failed, 4 w…', 'sweep: 14 of…' 
    page.close()


@contextmanager
def started_as_the_readme_says(log: Path, *flags: str) -> Iterator[str]:
    """`streamlit run app/main.py` from the repository root, with none of browser_kit's flags (its
    `--browser.gatherUsageStats false` would hide what app/.streamlit/config.toml must)."""
    port = free_port()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app/main.py", "--server.headless", "true",
                                 "--server.port", str(port), "--server.address", "127.0.0.1", *flags],
                                cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not _healthy(url):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_no_deploy_button_and_no_usage_statistics_notice(browser, tmp_path):  # noqa: F811
    deploy = '[data-testid="stAppDeployButton"]'
    for flags, buttons in (((), 0), (("--client.toolbarMode", "developer"), 1)):  # the second: the check can see one
        log = tmp_path / f"server{buttons}.log"
        with started_as_the_readme_says(log, *flags) as url:
            page = opened(browser, url, "Runs", ready='[data-testid="stMainMenu"]')
            assert page.locator(deploy).count() == buttons
            page.close()
        assert "usage statistics" not in log.read_text()  # app/.streamlit/config.toml: gatherUsageStats = false
