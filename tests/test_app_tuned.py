"""The tuned lens on the app's Logit lens page (AppTest): the shipped shakespeare_gpt shows the
second KL line under the logit lens's and the tuned grid with the probe's numbers; a snapshot
without one says how to train it; a lens for another model is an error box, the page goes on."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from models import build_model, get_preset
from models.checkpoint import load_checkpoint, save_snapshot
from models.tokenizers import CharTokenizer
from probes import logit_lens, tuned_lens
from probes.lens.tuned_file import lens_paths

REPO = Path(__file__).resolve().parent.parent
APP = REPO / "app" / "main.py"
GPT = REPO / "checkpoints" / "shakespeare_gpt"
TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun."


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """`plain`: a small run with no tuned lens; `stranger`: one holding shakespeare_gpt's lens."""
    root = tmp_path_factory.mktemp("tuned_runs")
    tok = CharTokenizer.from_text(open(REPO / "data" / "tinyshakespeare.txt").read())
    for name in ("plain", "stranger"):
        torch.manual_seed(0)
        save_snapshot(root / name / "step_000000", build_model(get_preset("tiny_shakespeare_gpt_small")), tok)
    for src, dst in zip(lens_paths(GPT / "step_001500"), lens_paths(root / "stranger" / "step_000000")):
        shutil.copy(src, dst)
    return root


@pytest.fixture
def app(runs, monkeypatch):
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    st.cache_data.clear()
    st.cache_resource.clear()
    monkeypatch.setenv("SCRATCHSCOPE_RUNS", f"{GPT}:{runs}")
    monkeypatch.setenv("SCRATCHSCOPE_NO_SHIPPED", "1")
    at = AppTest.from_file(str(APP), default_timeout=180)
    at.run()
    return at


def open_lens(at, run: str):
    at.sidebar.selectbox(key="run").set_value(run)
    at.run()
    at.switch_page("views/lens.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def chart_frames(at, index: int) -> list:
    chart = at.get("vega_lite_chart")[index]
    return [pa.ipc.open_stream(d.data.data).read_all().to_pandas() for d in chart.proto.datasets]


def test_shipped_gpt_shows_tuned_kl_and_grid(app):
    open_lens(app, "shakespeare_gpt")
    assert not app.error, [e.value for e in app.error]
    charts = app.get("vega_lite_chart")
    assert len(charts) == 6  # logit grid, logit KL, both KL lines, tuned grid, attribution bars and heads
    (kl,) = chart_frames(app, 2)
    snap = load_checkpoint(GPT)
    ids = snap.encode(TEXT)[:, :64]
    expected_tuned = logit_lens.run(snap.model, ids, lens=tuned_lens.load(snap)).kl_to_final
    expected_logit = logit_lens.run(snap.model, ids).kl_to_final
    tuned = kl[kl["lens"] == "tuned lens"]["KL(final || layer)"].tolist()
    logit = kl[kl["lens"] == "logit lens"]["KL(final || layer)"].tolist()
    assert tuned == pytest.approx(expected_tuned, abs=1e-6) and logit == pytest.approx(expected_logit, abs=1e-6)
    assert all(t < l for t, l in zip(tuned[:-1], logit[:-1]))
    (cells,) = chart_frames(app, 3)
    (plain_cells,) = chart_frames(app, 0)
    assert len(set(cells["layer"])) == 5 and "tuned lens: top-1" in charts[3].proto.spec
    embed = cells["layer"] == "embed"
    assert (cells["top-1 probability"][embed] != plain_cells["top-1 probability"][embed]).any()
    last = cells["layer"] == "3_post"  # the last layer is the model's own readout in both grids
    assert cells["top-1 probability"][last].tolist() == pytest.approx(
        plain_cells["top-1 probability"][last].tolist(), abs=1e-6)


def test_no_tuned_lens_is_an_info_line_with_the_command(app):
    open_lens(app, "plain")
    assert not app.error
    assert any("python -m probes.tuned_lens --ckpt" in i.value and "--steps" in i.value for i in app.info)
    assert len(app.get("vega_lite_chart")) == 4  # the logit lens still draws (and the attribution)


def test_a_lens_of_another_model_is_an_error_box(app):
    open_lens(app, "stranger")
    assert any("another model" in e.value for e in app.error), [e.value for e in app.error]
    assert len(app.get("vega_lite_chart")) == 4  # the logit lens and the attribution
