"""The app's head-type grid (Attention page) and attribution view (Logit lens page), driven by
AppTest on the runs tests/test_app.py trains: the charts carry probes.heads' and
probes.attribution's numbers, the controls change them, and bad input is an error box."""

from __future__ import annotations

import json

import pytest
import torch
from test_app import app, chart_data, open_page, runs  # noqa: F401  (fixtures and helpers)

from models.checkpoint import load_checkpoint
from probes import attribution, heads


def chart_titled(at, words: str):
    for i in range(len(at.get("vega_lite_chart"))):
        frames, spec = chart_data(at, i)
        titles = [spec.get("title")] + [layer.get("title") for layer in spec.get("layer", [])]
        if words in json.dumps(titles, ensure_ascii=False):
            return frames[0]
    raise AssertionError(f"no chart titled with {words!r}")


def snapshot_ids(at, runs):  # noqa: F811
    snap = load_checkpoint(runs / "a_rms")
    text = at.sidebar.text_area(key="text").value
    return snap, torch.tensor([snap.tokenizer.encode(text)[: snap.config.n_ctx]])


def test_head_types_grid_beside_the_entropy_grid_carries_the_probe_scores(app, runs):  # noqa: F811
    open_page(app, "attention")
    snap, ids = snapshot_ids(app, runs)
    expected = heads.run(snap.model, ids)
    grid = chart_titled(app, "previous token score per head")
    # the chart reads the first view saved when the run was trained (another thread count, another
    # time): scores in [0, 1] agree to 1e-5 of that scale, above float32's summation noise (tests/close.py)
    assert len(grid) == snap.config.n_layers * snap.config.n_heads
    for row in grid.itertuples():
        assert row.score == pytest.approx(expected.scores["previous_token"][row.layer][row.head], abs=1e-5)
        assert getattr(row, "sink") == pytest.approx(expected.scores["sink"][row.layer][row.head], abs=1e-5)
    app.radio(key="head_type").set_value("induction (random repeat)").run()
    repeat = heads.run_repeat(snap.model, samples=8, seed=0, copying=False)
    grid = chart_titled(app, "induction (random repeat) score per head")
    for row in grid.itertuples():
        assert row.score == pytest.approx(repeat.induction_repeat[row.layer][row.head], abs=1e-5)
    assert not app.error and not app.exception


def test_attribution_view_on_the_lens_page(app, runs):  # noqa: F811
    open_page(app, "lens")
    snap, ids = snapshot_ids(app, runs)
    bars = chart_titled(app, "direct attribution per component")
    expected = attribution.run(snap.model, ids, position=-1)
    assert list(bars["component"]) == expected.labels
    assert bars["attribution"].sum() == pytest.approx(expected.logit, abs=1e-4)
    cells = chart_titled(app, "direct attribution per head")
    assert len(cells) == snap.config.n_layers * snap.config.n_heads
    app.number_input(key="attr_position").set_value(2).run()
    app.text_input(key="attr_target").set_value("e").run()
    app.text_input(key="attr_versus").set_value("k").run()
    bars = chart_titled(app, "direct attribution per component")
    e_minus_k = attribution.run(snap.model, ids, position=2, target="e", versus="k")
    assert bars["attribution"].tolist() == pytest.approx(e_minus_k.values, abs=1e-6)
    assert any("minus" in m.value for m in app.markdown)
    assert not app.error


def test_attribution_bad_token_is_an_error_box_and_the_lens_stays(app):  # noqa: F811
    open_page(app, "lens")
    app.text_input(key="attr_target").set_value("Zz").run()
    assert any("not in the vocabulary" in e.value for e in app.error) and not app.exception
    assert chart_titled(app, "top-1 token per layer and position") is not None  # the rest of the page is there
