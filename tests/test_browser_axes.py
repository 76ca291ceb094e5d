"""A diverged run's charts in a real browser (issue 29, item 6): the shipped transformer4_nan's loss
is drawn on a log axis whose chart says so, on the Overview and on Compare, and the y-axis choice
that replaced the log toggle sits on one line and on no chart, at 1024 and 1920 px."""

from __future__ import annotations

import pytest
from browser_kit import browser, server  # noqa: F401 - fixtures
from test_browser_review import CHART, overlaps, settled

pytestmark = pytest.mark.browser


@pytest.mark.parametrize("width", [1024, 1920])
@pytest.mark.parametrize("name,title,charts", [("overview", "Overview", 2), ("compare", "Compare", 12)])
def test_a_diverged_loss_says_it_is_on_a_log_axis_and_no_control_covers_a_chart(server, browser, width,  # noqa: F811
                                                                                 name, title, charts):
    page = browser.new_page(viewport={"width": width, "height": 900})
    page.goto(f"{server}/{name}?run=transformer4_nan", timeout=120_000)
    page.get_by_role("heading", name=title).first.wait_for(timeout=120_000)
    settled(page, charts)
    loss = page.locator(CHART).filter(has_text="loss").first
    texts = loss.locator("svg text").all_text_contents()
    assert any(t.startswith("log y-axis: the values span") for t in texts), texts
    for axis in ("y-axis", "x-axis")[: 2 if name == "compare" else 1]:
        radio = page.locator('[data-testid="stRadio"]').filter(has_text=axis).first
        tops = {round(label.bounding_box()["y"]) for label in radio.locator("label").all()[1:]}  # the options
        assert len(tops) == 1, (axis, tops)  # auto, linear and log on one line (step, tokens seen)
    assert overlaps(page) == []
    page.close()
