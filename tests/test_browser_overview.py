"""The Overview of a diverged run in a real browser at 1280x900 (issue 38, item 4): the loss chart is
in the first screen, right under the doctor's verdict, and the findings are one line each with only
the first failure open (all eight open made the page 6,100 px tall, the chart 5,150 px down)."""

from __future__ import annotations

import pytest

from browser_kit import browser, server  # noqa: F401  (fixtures)

pytestmark = pytest.mark.browser

SCREEN = 900


def test_a_diverged_runs_loss_chart_is_in_the_first_screen(browser, server):  # noqa: F811
    page = browser.new_page(viewport={"width": 1280, "height": SCREEN})
    page.goto(f"{server}/?run=transformer4_nan", timeout=120_000)
    page.wait_for_function("document.querySelectorAll('[data-testid=\"stVegaLiteChart\"] canvas, "
                           "[data-testid=\"stVegaLiteChart\"] svg').length >= 1", timeout=120_000)
    page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=120_000)
    page.wait_for_timeout(800)
    found = page.evaluate("""() => {
        const main = document.querySelector('[data-testid="stMain"]');
        const chart = document.querySelector('[data-testid="stVegaLiteChart"]').getBoundingClientRect();
        const findings = [...document.querySelectorAll('[data-testid="stExpander"] details')]
            .filter(d => /failed|warning|info/.test(d.querySelector('summary').innerText));
        return {top: chart.top + main.scrollTop, bottom: chart.bottom + main.scrollTop,
                open: findings.filter(d => d.open).map(d => d.querySelector('summary').innerText),
                findings: findings.length};
    }""")
    assert found["findings"] >= 8, found
    assert len(found["open"]) == 1 and found["open"][0].split()[1] == "failed", found  # after the arrow icon
    # the chart starts in the first screen with its plot in view (its top 300 px hold the axes and lines)
    assert found["top"] + 300 < SCREEN and (found["top"] + found["bottom"]) / 2 < SCREEN, found
    page.close()
