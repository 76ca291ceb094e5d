"""The app reviewed page by page in a real browser (issue 29): what a new user tripped over, each
checked where it was seen: controls never on top of a chart at any width from 1024 px, ..."""

from __future__ import annotations

import pytest
from browser_kit import browser, server  # noqa: F401 - fixtures

pytestmark = pytest.mark.browser

CHART = '[data-testid="stVegaLiteChart"]'
CONTROLS = ", ".join(f'[data-testid="{t}"]' for t in ("stRadio", "stSelectbox", "stSlider", "stCheckbox",
                                                       "stToggle", "stButton", "stTextInput", "stMultiSelect"))
BOXES = f"""() => {{
  const box = e => {{ const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; }};
  const charts = [...document.querySelectorAll('{CHART}')].map(c => c.querySelector('svg, canvas'))
                   .filter(Boolean).map(box);
  const controls = [...document.querySelectorAll('[data-testid="stMain"] :is({CONTROLS})')]
                   .map(c => [c.dataset.testid, c.innerText.split('\\n')[0], ...box(c)]);
  return [charts, controls]; }}"""


def settled(page, charts: int) -> None:
    page.wait_for_function(f"document.querySelectorAll('{CHART} canvas, {CHART} svg').length >= {charts}",
                           timeout=120_000)
    page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=120_000)
    page.wait_for_timeout(1000)


def overlaps(page) -> list:
    charts, controls = page.evaluate(BOXES)
    return [(name, label, chart) for name, label, *c in controls for chart in charts
            if c[0] < chart[2] - 1 and chart[0] < c[2] - 1 and c[1] < chart[3] - 1 and chart[1] < c[3] - 1]


@pytest.mark.parametrize("width", [1024, 1280, 1500, 1920])
def test_no_control_sits_on_the_attention_grids(server, browser, width):  # noqa: F811
    page = browser.new_page(viewport={"width": width, "height": 900})
    page.goto(f"{server}/attention?run=shakespeare_gpt", timeout=120_000)
    page.get_by_role("heading", name="Attention").first.wait_for(timeout=120_000)
    settled(page, 4)
    assert overlaps(page) == []
    page.close()
