"""Following a run in training in a real browser (tests/browser_kit.py serves the app on a runs
folder of its own): the Overview picks up new records in its fragments, with no full script run
(which would grey the page), and a new snapshot moves the sidebar's slider; a run folder made
after start shows on the landing view by itself; the landing view's links keep `?run=`."""

from __future__ import annotations

import time

import pytest
from browser_kit import browser, serve  # noqa: F401 - fixtures
from live_run import grow, start_run

pytestmark = pytest.mark.browser


def count_full_runs(page) -> list[int]:
    """A list that grows by one each time a full script run finishes in `page` (read from the
    websocket's ForwardMsgs: a fragment's rerun finishes with a status of its own)."""
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    finished = []

    def frame(payload) -> None:
        if isinstance(payload, bytes):
            msg = ForwardMsg()
            msg.ParseFromString(payload)
            if msg.WhichOneof("type") == "script_finished" and msg.script_finished == ForwardMsg.FINISHED_SUCCESSFULLY:
                finished.append(1)
    page.on("websocket", lambda ws: ws.on("framereceived", frame))
    return finished


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("live") / "runs"
    start_run(folder / "live_run", upto=500)
    return folder


@pytest.fixture(scope="module")
def server(runs):
    with serve({"SCRATCHSCOPE_RUNS": str(runs), "SCRATCHSCOPE_NO_SHIPPED": "1"}) as url:
        yield url


def quiet(page) -> None:
    page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=120_000)


def slider_value(page) -> str:
    return page.locator('[data-testid="stSidebar"] [data-testid="stSliderThumbValue"]').first.inner_text()


def test_the_overview_follows_new_records_in_place_and_a_new_snapshot_moves_the_slider(server, browser, runs):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    full_runs = count_full_runs(page)
    page.goto(f"{server}/?run=live_run", timeout=120_000)
    page.get_by_text("steps 0..500").first.wait_for(timeout=120_000)
    page.get_by_text("tokens seen").first.wait_for(timeout=120_000)  # the model loaded: the run is over
    quiet(page)
    assert slider_value(page) == "step_000500"
    before = len(full_runs)
    assert before >= 1  # the page's own run was counted
    grow(runs / "live_run", 700, snapshots=False)
    page.get_by_text("steps 0..700").first.wait_for(timeout=30_000)  # the curves' fragment re-read
    page.wait_for_timeout(3500)  # another fragment period: nothing else reruns the page either
    assert len(full_runs) == before, "new records made a full rerun (the whole page greys)"
    grow(runs / "live_run", 1000)  # and the snapshot at step 1000: one full rerun puts it in the slider
    page.wait_for_function("""() => [...document.querySelectorAll('[data-testid="stSidebar"] '
                             + '[data-testid="stSliderThumbValue"]')].some(e => e.innerText === 'step_001000')""",
                           timeout=30_000)
    page.get_by_text("steps 0..1000").first.wait_for(timeout=30_000)
    deadline = time.time() + 60
    while len(full_runs) == before and time.time() < deadline:  # the run loads step 1000's model
        page.wait_for_timeout(250)
    assert len(full_runs) > before  # the one full rerun a new snapshot takes (and the counter sees it)
    assert page.locator('[data-testid="stException"]').count() == 0
    page.close()


def test_a_run_folder_made_after_start_appears_on_the_landing_view(server, browser, runs):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(server, timeout=120_000)
    page.get_by_role("heading", name="Runs").first.wait_for(timeout=120_000)
    page.locator('[data-testid="stPageLink"]').filter(has_text="live_run").first.wait_for(timeout=120_000)
    quiet(page)
    start_run(runs / "later_run", upto=0)
    page.locator('[data-testid="stPageLink"]').filter(has_text="later_run").first.wait_for(timeout=30_000)
    page.close()


def test_a_landing_link_opens_the_overview_with_the_run_in_the_address(server, browser):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(server, timeout=120_000)
    link = page.locator('[data-testid="stPageLink"]').filter(has_text="live_run").first
    link.wait_for(timeout=120_000)
    quiet(page)
    link.click()
    page.get_by_role("heading", name="Overview").first.wait_for(timeout=120_000)
    page.wait_for_function("location.search.includes('run=live_run')", timeout=30_000)
    quiet(page)
    assert "?run=live_run" in page.url
    page.reload()  # what the address says opens the same run again
    page.get_by_role("heading", name="Overview").first.wait_for(timeout=120_000)
    page.get_by_text("steps 0..").first.wait_for(timeout=120_000)
    page.close()
