"""The app reviewed page by page in a real browser (issue 29): what a new user tripped over, each
checked where it was seen: controls never on top of a chart at any width from 1024 px, ..."""

from __future__ import annotations

import pytest
from browser_kit import REPO, browser, server  # noqa: F401 - fixtures

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


def run_shown(page) -> str:
    """The run the sidebar's selectbox shows."""
    return page.locator('[data-testid="stSidebar"] input[aria-label="run"]').first.input_value()


def visit(browser, url: str, title: str, width: int = 1280):
    """A new 900 px high page at `url`, once the page titled `title` has drawn."""
    page = browser.new_page(viewport={"width": width, "height": 900})
    page.goto(url, timeout=120_000)
    opened(page, title)
    return page


def opened(page, title: str) -> None:
    page.get_by_role("heading", name=title).first.wait_for(timeout=120_000)
    page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=120_000)
    page.wait_for_timeout(1000)


@pytest.mark.parametrize("name,title", [("overview", "Overview"), ("attention", "Attention"), ("lens", "Logit lens")])
def test_every_pages_own_path_opens_with_a_run(server, browser, name, title):  # noqa: F811
    page = visit(browser, f"{server}/{name}?run=mha4", title)
    assert page.get_by_text("Page not found").count() == 0
    assert run_shown(page) == "mha4"
    assert f"/{name}?run=mha4" in page.url
    page.close()


def test_the_address_keeps_the_run_and_snapshot_across_pages_and_reloads(server, browser):  # noqa: F811
    page = visit(browser, f"{server}/attention?run=transformer4_nan", "Attention")
    page.locator('[data-testid="stSidebarNav"] a').filter(has_text="Logit lens").click()
    opened(page, "Logit lens")
    page.wait_for_url("**/lens?run=transformer4_nan", timeout=30_000)
    page.reload()
    opened(page, "Logit lens")
    assert run_shown(page) == "transformer4_nan"
    page.goto(f"{server}/embeddings?run=mha4&snapshot=step_000500", timeout=120_000)
    opened(page, "Embeddings")
    slider = page.locator('[data-testid="stSidebar"] [data-testid="stSlider"]')
    assert "step_000500" in slider.inner_text()
    page.locator('[data-testid="stSidebarNav"] a').filter(has_text="Overview").click()
    opened(page, "Overview")
    page.wait_for_url("**/overview?run=mha4&snapshot=step_000500", timeout=30_000)
    page.close()


def test_a_typed_path_is_named_in_the_address_and_a_bad_one_changes_nothing(server, browser):  # noqa: F811
    page = visit(browser, f"{server}/overview?run=mha4", "Overview")
    page.locator('[data-testid="stSidebar"]').get_by_text("Open a path").click()
    path = page.locator('[data-testid="stSidebar"] input[type="text"]').first
    path.fill(str(REPO / "checkpoints" / "char_mlp"))
    path.press("Enter")
    # the selectbox is briefly absent while the page reruns: wait for it to exist and show the run
    page.wait_for_function("() => document.querySelector('[data-testid=\"stSidebar\"] input[aria-label=\"run\"]')"
                           "?.value == 'char_mlp'", timeout=60_000)
    opened(page, "Overview")
    page.wait_for_url("**?run=char_mlp", timeout=30_000)
    path.fill(str(REPO / "no such run"))
    path.press("Enter")
    page.locator('[data-testid="stSidebar"] [data-testid="stAlertContentError"]').first.wait_for(timeout=60_000)
    opened(page, "Overview")
    assert run_shown(page) == "char_mlp"
    page.wait_for_url("**?run=char_mlp", timeout=30_000)
    page.close()


def test_a_link_to_a_step_on_training_dynamics_lands_on_its_table(server, browser):  # noqa: F811
    page = visit(browser, f"{server}/dynamics?run=shakespeare_rms4&step=1000", "Training dynamics")
    settled(page, 5)
    heading = page.get_by_role("heading", name="g / w / u of shakespeare_rms4")
    page.wait_for_function("""() => { const h = [...document.querySelectorAll('h3')]
        .find(e => e.textContent.startsWith('g / w / u of')); const r = h && h.getBoundingClientRect();
        return r && r.top >= 0 && r.bottom <= window.innerHeight; }""", timeout=30_000)
    assert heading.count() == 1
    assert page.get_by_text("At step 1000, group medians").count() == 1  # the table's step is the link's
    assert page.get_by_text("At the last logged step (3000)").count() == 1  # the chart's caption says its own
    page.close()
