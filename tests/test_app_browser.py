"""The app in a real browser (tests/browser_kit.py serves it): every page opened on the shipped
runs and photographed, a head picked, a cell of the Patching heat map clicked on the induction run, the
landing view, the doctor's verdict, a nanoGPT folder."""

from __future__ import annotations

import time

import pytest
from browser_kit import PAGES, REPO, browser, open_page, photograph, serve, server, shots  # noqa: F401 - fixtures

pytestmark = pytest.mark.browser


@pytest.mark.parametrize("name", list(PAGES))
def test_every_page_renders_its_charts_and_is_photographed(server, browser, shots, name):
    page = open_page(browser, server, name)
    photograph(page, shots / f"{name}.png")
    assert (shots / f"{name}.png").stat().st_size > 10_000
    page.close()


def test_patching_heat_map_on_the_induction_run_and_a_click_on_a_cell(server, browser):  # noqa: F811
    """The strongest cell's top predictions first; a click on another cell shows that patched run's."""
    page = open_page(browser, server, "patching", run="induction")
    heading = page.locator('[data-testid="stMarkdown"]').filter(has_text="The patched run at")
    heading.first.wait_for(timeout=60_000)
    assert "layer 0, pos 2, head 0" in heading.first.inner_text()
    cell = page.locator('[data-testid="stVegaLiteChart"]').nth(0).locator(
        'svg path[aria-label*="row: L1H2;"][aria-label*="column: 30: "]')
    cell.first.wait_for(timeout=60_000)
    cell.first.scroll_into_view_if_needed()
    box = cell.first.bounding_box()
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    heading.filter(has_text="layer 1, pos 30, head 2").first.wait_for(timeout=60_000)
    assert page.locator('[data-testid="stAlertContentError"]').count() == 0
    page.close()


def test_picking_another_head_changes_the_heatmap(server, browser):
    page = open_page(browser, server, "attention")
    heatmap = page.locator('[data-testid="stVegaLiteChart"]').nth(2)  # after the entropy and head-type grids
    heatmap.scroll_into_view_if_needed()
    before = heatmap.screenshot()
    caption = page.locator('[data-testid="stMarkdown"]').filter(has_text="entropy")  # not the small multiples' titles
    caption.filter(has_text="L0H0:").first.wait_for()
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
    caption.filter(has_text="L0H2:").first.wait_for(timeout=60_000)
    deadline = time.time() + 60
    while time.time() < deadline:  # vega redraws a moment after the page text changes
        page.wait_for_timeout(500)
        after = page.locator('[data-testid="stVegaLiteChart"]').nth(2).screenshot()
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
    shipped = REPO / "checkpoints"  # a link per run (the sweep's runs too) and one per sweep
    assert links.count() == len([*shipped.glob("*/run.json"), *shipped.glob("*/*/run.json"), *shipped.glob("*/sweep.json")])
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
