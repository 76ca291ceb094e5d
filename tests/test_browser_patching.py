"""The Patching page in a real browser (tests/browser_kit.py serves the app) on the shipped induction
run: the heat map is drawn, and a click on one of its cells shows that patched run's top predictions."""

from __future__ import annotations

import pytest
from browser_kit import browser, open_page, server  # noqa: F401 - fixtures

pytestmark = pytest.mark.browser

CHART = '[data-testid="stVegaLiteChart"]'


def test_the_heat_map_is_drawn_and_a_click_shows_that_patched_run(server, browser):  # noqa: F811
    page = open_page(browser, server, "patching", run="induction")
    heading = page.locator('[data-testid="stMarkdown"]').filter(has_text="The patched run at")
    heading.first.wait_for(timeout=60_000)
    assert "layer 0, pos 2, head 0" in heading.first.inner_text()  # the strongest cell, before any click
    cell = page.locator(CHART).nth(0).locator('svg path[aria-label*="row: L1H2;"][aria-label*="column: 30: "]')
    cell.first.wait_for(timeout=60_000)
    cell.first.scroll_into_view_if_needed()
    box = cell.first.bounding_box()
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    heading.filter(has_text="layer 1, pos 30, head 2").first.wait_for(timeout=60_000)
    assert page.locator('[data-testid="stException"]').count() == 0
    assert page.locator('[data-testid="stAlertContentError"]').count() == 0
