"""Following a run in training (AppTest): the sidebar's snapshot slider and Training dynamics' g/w/u
step slider sit on the newest step until the user moves them, and follow again once moved back to
the end; a run folder that appears after the app started is listed at the next rerun. (The browser
half, fragments re-running without greying the page, is tests/test_browser_live.py.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from live_run import SHIPPED, grow, start_run
from test_app import fresh_app



@pytest.fixture
def runs(tmp_path) -> Path:
    start_run(tmp_path / "runs" / "live_run", upto=500)
    return tmp_path / "runs"


@pytest.fixture
def app(runs, monkeypatch):
    at = fresh_app(runs, monkeypatch, run="live_run")
    assert not at.exception, [e.value for e in at.exception]
    return at


def rerun(at):
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_the_snapshot_slider_follows_new_snapshots_until_moved(app, runs):
    key = f"snap:{runs / 'live_run'}"
    assert app.sidebar.select_slider(key=key).value == "step_000500"
    assert "follows again" in app.sidebar.select_slider(key=key).help
    grow(runs / "live_run", 1000)
    assert rerun(app).sidebar.select_slider(key=key).value == "step_001000"  # not moved: follows
    app.sidebar.select_slider(key=key).set_value("step_000000").run()
    grow(runs / "live_run", 2000)
    assert rerun(app).sidebar.select_slider(key=key).value == "step_000000"  # moved: stays
    assert app.sidebar.select_slider(key=key).options[-1] == "step_002000"
    app.sidebar.select_slider(key=key).set_value("step_002000").run()  # back to the end: follows again
    shutil.copytree(SHIPPED / "step_002000", runs / "live_run" / "step_003000")  # a fourth snapshot
    assert rerun(app).sidebar.select_slider(key=key).value == "step_003000"
    assert not app.warning  # no "default value and Session State" warning


def test_the_gwu_step_slider_follows_new_records_until_moved(app, runs):
    app.switch_page("views/dynamics.py")
    rerun(app)
    assert app.toggle(key="follow").value is True  # fresh metrics under a lock: live by default
    assert app.select_slider(key="gwu_step").value == 500
    grow(runs / "live_run", 700, snapshots=False)
    assert rerun(app).select_slider(key="gwu_step").value == 700
    app.select_slider(key="gwu_step").set_value(300).run()
    grow(runs / "live_run", 900, snapshots=False)
    assert rerun(app).select_slider(key="gwu_step").value == 300  # moved: stays
    app.select_slider(key="gwu_step").set_value(900).run()
    grow(runs / "live_run", 1000, snapshots=False)
    assert rerun(app).select_slider(key="gwu_step").value == 1000  # moved back to the end: follows


def test_the_overview_of_a_training_run_is_live_and_says_its_last_step(app, runs):
    assert app.toggle(key="follow_overview").value is True
    assert any(c.value.endswith("steps 0..500") for c in app.caption)
    grow(runs / "live_run", 600, snapshots=False)
    assert any(c.value.endswith("steps 0..600") for c in rerun(app).caption)


def test_a_run_folder_made_after_start_is_listed_at_the_next_rerun(app, runs):
    app.query_params.clear()
    app.switch_page("views/home.py")
    assert list(rerun(app).dataframe[0].value["run"]) == ["live_run"]
    start_run(runs / "second_run", upto=0)
    rerun(app)
    assert list(app.dataframe[0].value["run"]) == ["live_run", "second_run"]
    assert "second_run" in app.sidebar.selectbox(key="run").options
    assert {p.proto.query_string for p in app.get("page_link")} == {"run=live_run", "run=second_run"}


def test_the_apps_torch_threads_come_from_the_environment_and_bad_values_are_refused(monkeypatch):
    from app import data

    monkeypatch.delenv("SCRATCHSCOPE_TORCH_THREADS", raising=False)
    assert data.torch_threads() == 1
    monkeypatch.setenv("SCRATCHSCOPE_TORCH_THREADS", "3")
    assert data.torch_threads() == 3
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv("SCRATCHSCOPE_TORCH_THREADS", bad)
        with pytest.raises(ValueError, match="SCRATCHSCOPE_TORCH_THREADS"):
            data.torch_threads()
