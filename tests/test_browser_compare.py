"""The Compare page's run overlay in a real browser (tests/browser_kit.py serves the app): a second
run picked in the multiselect is drawn on the same charts, its name beside the first run's in the
legends, and nothing on the page is an exception."""

from __future__ import annotations

import time

import pytest
from browser_kit import browser, open_page, server  # noqa: F401 - fixtures

pytestmark = pytest.mark.browser

CHARTS = '[data-testid="stVegaLiteChart"]'


def legend_texts(page, index: int) -> list[str]:
    """The text of the index-th chart's svg (axis titles, legend labels)."""
    return page.locator(CHARTS).nth(index).locator("svg text").all_text_contents()


def test_a_second_run_picked_is_overlaid_and_named_in_the_legends(server, browser):
    page = open_page(browser, server, "compare", run="shakespeare_rms4")
    picker = page.locator('[data-testid="stMultiSelect"]').filter(has_text="runs to overlay")
    assert "shakespeare_rms4_adam" in picker.inner_text()  # the default second run: same preset
    box = picker.locator("input")
    box.click()
    box.press("Backspace")  # drop the default second run...
    page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=120_000)
    box.click()
    box.fill("mha4")  # ...and pick another
    page.get_by_role("option", name="mha4").first.click()
    page.keyboard.press("Escape")
    deadline = time.time() + 120
    while time.time() < deadline:  # vega redraws each chart a moment after the rerun, one after another
        page.wait_for_timeout(500)
        texts, rate_texts = legend_texts(page, 0), legend_texts(page, 1)
        if "mha4" in texts and "shakespeare_rms4_adam" not in texts and "mha4" in rate_texts:
            break
    assert {"shakespeare_rms4", "mha4"} <= set(texts), texts
    assert {"train loss", "val loss"} <= set(texts)  # the dash legend: train solid, val dashed
    assert {"shakespeare_rms4", "mha4"} <= set(rate_texts), rate_texts  # the learning rate too
    drawn = page.locator(f"{CHARTS} svg, {CHARTS} canvas").count()
    assert drawn >= 6, drawn  # loss, learning rate, entropy per layer and u per group at least
    assert page.locator('[data-testid="stException"]').count() == 0
    assert page.locator('[data-testid="stAlertContentError"]').count() == 0
    page.close()
