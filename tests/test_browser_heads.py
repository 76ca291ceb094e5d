"""Heads at a glance in a real browser (tests/browser_kit.py serves the app): a click on a cell
of the entropy grid picks that head, hovering a token in the token view shows what it attends
to, and the Logit lens grid at 64 positions stays inside the page."""

from __future__ import annotations

import time

import pytest
from browser_kit import browser, open_page, server  # noqa: F401 - fixtures

pytestmark = pytest.mark.browser

CHART = '[data-testid="stVegaLiteChart"]'


def mark(chart, words: str):
    """The SVG mark whose accessible label (Vega writes the encoded fields there) holds `words`."""
    found = chart.locator(f'svg path[aria-label*="{words}"]')
    found.first.wait_for(timeout=60_000)
    return found.first


def click_centre(page, element) -> None:
    """A real mouse click in the middle of the mark (the verdict text on top of it is part of the
    same cell, so the click may land on either)."""
    element.scroll_into_view_if_needed()
    box = element.bounding_box()
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)


def changed(page, index: int, before: bytes, timeout_s: float = 60) -> bool:
    deadline = time.time() + timeout_s
    while time.time() < deadline:  # vega redraws a moment after the page text changes
        page.wait_for_timeout(500)
        if page.locator(CHART).nth(index).screenshot() != before:
            return True
    return False


def test_a_click_on_a_grid_cell_picks_that_head(server, browser):  # noqa: F811
    page = open_page(browser, server, "attention")
    caption = page.locator('[data-testid="stMarkdown"]').filter(has_text="entropy")  # "L{l}H{h}: verdict, entropy ..."
    caption.filter(has_text="L0H0:").first.wait_for(timeout=60_000)
    heatmap = page.locator(CHART).nth(2)
    heatmap.scroll_into_view_if_needed()
    before = heatmap.screenshot()
    grid = page.locator(CHART).nth(0)
    click_centre(page, mark(grid, "head: 3; layer: 2;"))
    caption.filter(has_text="L2H3:").first.wait_for(timeout=60_000)
    assert caption.filter(has_text="L0H0:").count() == 0
    boxes = page.locator('[data-testid="stSelectbox"]')
    for name, value in (("layer", "2"), ("head", "3")):  # the boxes follow the click
        box = boxes.filter(has=page.get_by_text(name, exact=True)).first
        shown = box.locator("input").first.input_value() or box.inner_text()
        assert shown.strip().endswith(value), (name, shown, box.inner_html()[:400])
    assert changed(page, 2, before), "the heatmap did not change after clicking L2H3"
    grid = page.locator(CHART).nth(0)  # a fresh chart: another click is heard as well
    click_centre(page, mark(grid, "head: 1; layer: 0;"))
    caption.filter(has_text="L0H1:").first.wait_for(timeout=60_000)
    assert page.locator('[data-testid="stException"]').count() == 0
    page.close()


def test_hovering_a_token_shows_what_it_attends_to(server, browser):  # noqa: F811
    page = open_page(browser, server, "attention")
    view = page.locator(CHART).nth(5)
    view.scroll_into_view_if_needed()
    weights = view.locator("svg text")
    assert "1.00" not in weights.all_text_contents()  # the last token spreads its attention
    first = mark(view, "position: token: 0:")
    box = first.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    deadline = time.time() + 30
    while time.time() < deadline and "1.00" not in view.locator("svg text").all_text_contents():
        page.wait_for_timeout(300)
    assert "1.00" in view.locator("svg text").all_text_contents()  # token 0 sees only itself
    page.close()


def test_the_lens_grid_at_64_positions_stays_inside_the_page(server, browser):  # noqa: F811
    page = open_page(browser, server, "lens", run="shakespeare_gpt")  # the default text fills n_ctx = 64
    left, right = page.evaluate("""() => {  // the page's content box: inside the main block's padding
        const m = document.querySelector('[data-testid="stMainBlockContainer"]'), r = m.getBoundingClientRect(),
              s = getComputedStyle(m);
        return [r.left + parseFloat(s.paddingLeft), r.right - parseFloat(s.paddingRight)]; }""")
    grid = page.locator(CHART).nth(0).locator("svg").first.bounding_box()
    assert left - 1 <= grid["x"] and grid["x"] + grid["width"] <= right + 1, (grid, left, right)
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    labels = page.locator(CHART).nth(0).locator("svg path[aria-label]")
    assert labels.count() >= 5 * 64  # a cell for every layer (embed + 4) and position
    page.close()
