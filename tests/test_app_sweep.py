"""Sweeps in the app (AppTest): the landing view lists a sweep with its LR sensitivities, the Sweep
page draws final loss against learning rate with a diverged run marked above the chart's edge
(never at a made-up loss), shows the probe's sensitivities and stable ranges, and links each run.

The sweep is hand-made: six run folders whose metrics.jsonl hold losses chosen on paper, recorded
into sweep.json by the sweep's own book keeper (`train.sweep.book`), as `python -m train.sweep` does."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from probes import sweep as probe_sweep
from train.sweep.book import SweepBook
from train.sweep.grid import Grid

REPO = Path(__file__).resolve().parent.parent
APP = REPO / "app" / "main.py"
INIT = 4.0
FINALS = {("none", 1e-3): 3.0, ("none", 1e-2): 2.5, ("none", 1e-1): None,  # None: diverged at step 5
          ("rms", 1e-3): 3.1, ("rms", 1e-2): 2.4, ("rms", 1e-1): 2.2}


def write_run(folder: Path, final: float | None) -> None:
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"train": {"steps": 10}, "argv": []}))
    last = {"step": 10, "train_loss": final, "val_loss": final} if final is not None else \
        {"step": 5, "train_loss": None, "diverged": {"reason": "the train loss is nan", "first_nonfinite_loss_step": 5}}
    records = [{"step": 0, "val_loss": INIT}, last]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> Path:
    """A folder holding one sweep, `qk`, of 3 rates x qk_norm none/rms, finished."""
    root = tmp_path_factory.mktemp("sweeps")
    grid = Grid("transformer4_small", "data.txt", (1e-3, 1e-2, 1e-1), (("qk_norm", ("none", "rms")),))
    book = SweepBook(root / "qk", grid, {"command": "hand-made", "backend": "local", "workers": 2})
    (root / "qk").mkdir()
    for job in book.jobs(resume=False):
        final = FINALS[(job.point.values[0][1], job.point.lr)]
        write_run(job.out, final)
        book.finish(job, 0 if final is not None else 3, 1.0)
    book.close("finished")
    return root


@pytest.fixture
def start(roots, monkeypatch):
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    st.cache_data.clear()
    st.cache_resource.clear()  # caches outlive an AppTest
    monkeypatch.setenv("SCRATCHSCOPE_RUNS", str(roots))
    monkeypatch.setenv("SCRATCHSCOPE_NO_SHIPPED", "1")

    def open_app(page: str | None = None, **query: str):
        at = AppTest.from_file(str(APP), default_timeout=180)
        at.query_params.update(query)
        at.run()
        if page is not None:
            at.switch_page(f"views/{page}.py").run()
        assert not at.exception, [e.value for e in at.exception]
        return at
    return open_app


def datasets(chart) -> list:
    return [pa.ipc.open_stream(d.data.data).read_all().to_pandas() for d in chart.proto.datasets]


def test_the_landing_view_lists_the_sweep_with_its_sensitivities(start, roots):
    at = start()
    assert "Sweeps" in [h.value for h in at.subheader]
    row = next(d.value for d in at.dataframe if "sweep" in d.value.columns).iloc[0]  # the Sweeps table
    variants = probe_sweep.run(roots / "qk").variants
    assert row["sweep"] == "qk" and row["finished"] == "6 of 6" and row["status"] == "finished"
    assert row["LR sensitivity"] == "; ".join(f"{v['name']} {v['lr_sensitivity']:.3f}" for v in variants)
    assert "sweep=qk" in {p.proto.query_string for p in at.get("page_link")}


def test_the_sweep_page_draws_losses_and_marks_the_diverged_run_above_the_edge(start, roots):
    at = start("sweep", sweep="qk")
    frame = max((f for f in datasets(at.get("vega_lite_chart")[0]) if "point" in f), key=len)  # the points layer
    assert len(frame) == 6
    diverged = frame[frame["point"] == "diverged"]
    assert list(diverged["run"]) == ["qk/lr=1e-01,qk_norm=none"] and list(diverged["diverged at"]) == [5]
    assert diverged["final val loss"].isna().all() and diverged["clipped"].all()
    finite = frame[~frame["clipped"]]
    assert (finite["y"] == finite["final val loss"]).all()  # a finished run at its own loss
    assert sorted(finite["final val loss"]) == sorted(v for v in FINALS.values() if v is not None)
    assert float(diverged["y"].iloc[0]) > finite["y"].max()  # above every real loss, never at one
    spec = json.loads(at.get("vega_lite_chart")[0].proto.spec)
    assert "log" in json.dumps(spec)  # log-scaled rates


def test_the_sweep_page_shows_the_probes_sensitivities_and_links_every_run(start, roots):
    at = start("sweep", sweep="qk")
    table = at.dataframe[0].value.set_index("variant")
    for v in probe_sweep.run(roots / "qk").variants:
        assert table.loc[v["name"], "LR sensitivity (nats)"] == pytest.approx(v["lr_sensitivity"])
        assert table.loc[v["name"], "stable rates"] == probe_sweep.range_text(v["stable_range"])
    # on paper: none -> 3.0, 2.5 and 4.0 (diverged: its init) -> mean 19/6 minus 2.5; rms -> 7.7/3 - 2.2
    assert table.loc["qk_norm=none", "LR sensitivity (nats)"] == pytest.approx(19 / 6 - 2.5)
    assert table.loc["qk_norm=rms", "LR sensitivity (nats)"] == pytest.approx(7.7 / 3 - 2.2)
    assert table.loc["qk_norm=none", "stable rates"] == "1e-03..1e-02 (1.0 decades)"
    runs = {p.proto.query_string for p in at.get("page_link")}
    assert {f"run=qk%2Flr%3D1e-01%2Cqk_norm%3D{v}" for v in ("none", "rms")} <= runs  # sweep/run
    assert at.query_params["sweep"] == ["qk"] or at.query_params["sweep"] == "qk"


def test_an_unknown_sweep_is_said_and_no_sweep_is_explained(start, monkeypatch, tmp_path):
    at = start("sweep", sweep="nope")
    assert any("names no sweep" in w.value for w in at.warning)
    monkeypatch.setenv("SCRATCHSCOPE_RUNS", str(tmp_path))
    at = start("sweep")
    assert any("No sweep found" in i.value for i in at.info)


def test_a_click_on_a_point_names_its_run():
    from app import sweeps

    assert sweeps.clicked({"selection": {sweeps.CLICK: [{"run": "lr=1e-02,qk_norm=rms"}]}}) == "lr=1e-02,qk_norm=rms"
    assert sweeps.clicked({"selection": {sweeps.CLICK: []}}) is None and sweeps.clicked(None) is None


def test_the_landing_view_writes_a_blown_up_loss_short():
    from app.catalog import shown_loss

    assert shown_loss(2.84737) == "2.847" and shown_loss(116104.012) == "1.2e+05"  # a sweep's lr 1 run
    assert shown_loss(float("nan")) == "NaN" and shown_loss(None) == "NaN"
