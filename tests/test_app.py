"""The app driven by Streamlit's AppTest on small runs made here: every page renders without an
exception, its charts carry the probes' numbers, the sidebar's choices change them, and bad
checkpoints or an MLP-family run give an error box instead of a traceback."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from models.checkpoint import load_checkpoint
from probes import degenerate, entropy, updates

APP = Path(__file__).resolve().parent.parent / "app" / "main.py"
PAGES = ["overview", "attention", "dynamics", "embeddings", "lens", "compare"]
TEXT = "the king and the queen shall not be what thou art"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Three runs: a 4-block transformer with snapshots 0/10/20, a char MLP, and a corrupt one."""
    from train.loop import main

    root = tmp_path_factory.mktemp("runs")
    data = root.parent / "text.txt"
    from probes.first_view import PAGE_TEXT  # the sidebar's default text must be in the vocabulary

    data.write_text(("the king and the queen shall not be what thou art, my good lord.\n" * 40
                     + PAGE_TEXT + "\n") * 2)
    common = ["--data", str(data), "-q", "--steps", "20", "--batch-size", "8", "--log-every", "5",
              "--eval-every", "10", "--save-every", "10"]
    assert main(["--preset", "transformer4_rms_small", "--out", str(root / "a_rms"), *common]) == 0
    assert main(["--preset", "char_mlp_small", "--out", str(root / "b_mlp"), *common]) == 0
    assert main(["--preset", "transformer4_rms_small", "--out", str(root / "c_broken"), *common]) == 0
    weights = root / "c_broken" / "step_000020" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # truncated mid-save
    return root


@pytest.fixture
def app(runs, monkeypatch):
    return fresh_app(runs, monkeypatch)


def fresh_app(runs: Path, monkeypatch, run: str | None = None):
    """The app on the runs in `runs` only (no shipped ones), caches cleared (they outlive an
    AppTest), run once; `run` goes in as `?run=` (that run's Overview)."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    st.cache_data.clear()
    st.cache_resource.clear()
    monkeypatch.setenv("SCRATCHSCOPE_RUNS", str(runs))
    monkeypatch.setenv("SCRATCHSCOPE_NO_SHIPPED", "1")
    at = AppTest.from_file(str(APP), default_timeout=180)
    if run is not None:
        at.query_params["run"] = run
    at.run()
    return at


def open_page(at, name: str, run: str | None = None):
    if run is not None:
        at.sidebar.selectbox(key="run").set_value(run)
        at.run()
    at.switch_page(f"views/{name}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def chart_data(at, index: int) -> list:
    """The datasets of the index-th Vega-Lite chart on the page, as DataFrames."""
    chart = at.get("vega_lite_chart")[index]
    frames = [pa.ipc.open_stream(d.data.data).read_all().to_pandas() for d in chart.proto.datasets]
    spec = json.loads(chart.proto.spec)
    return frames, spec


def test_every_page_renders_without_an_exception(app):
    for name in PAGES:
        open_page(app, name)
        errors = [e.value for e in app.error]
        if name == "compare":  # snapshot B opens on the second run overlaid, c_broken, whose last snapshot is truncated
            errors = [e for e in errors if not ("c_broken" in e and "truncated" in e)]
        assert not errors, (name, errors)
        assert app.get("vega_lite_chart"), f"{name} drew no chart"


def test_attention_grid_carries_the_probe_verdicts_and_entropies(app, runs):
    open_page(app, "attention")
    (grid,), _ = chart_data(app, 0)
    snap = load_checkpoint(runs / "a_rms")
    ids = torch.tensor([snap.tokenizer.encode(app.sidebar.text_area(key="text").value)[: snap.config.n_ctx]])
    expected = degenerate.run(snap.model, ids)
    ent = entropy.run(snap.model, ids)
    assert len(grid) == snap.config.n_layers * snap.config.n_heads
    for row in grid.itertuples():
        assert row.verdict == expected.verdicts[row.layer][row.head]
        # from the first view saved at training time: [0, 1] values to 1e-5 of that scale (tests/close.py)
        assert getattr(row, "_3") == pytest.approx(ent.entropy_normalized[row.layer][row.head], abs=1e-5)


def test_heatmap_labels_are_the_tokens_and_follow_layer_head_and_text(app):  # chart 1: head types
    open_page(app, "attention")
    (heat,), _ = chart_data(app, 2)
    text = app.sidebar.text_area(key="text").value
    n = min(len(text), 16)
    assert len(heat) == n * (n + 1) // 2  # the causal triangle
    labels = sorted(set(heat["query"]), key=lambda s: int(s.split(":")[0]))
    assert [l.split(": ", 1)[1] for l in labels] == [c.replace(" ", "␣").replace("\n", "⏎") for c in text[:n]]
    for q, group in heat.groupby("q"):
        assert group["p"].sum() == pytest.approx(1.0, abs=1e-6)  # every row is a distribution (fp32)
    app.selectbox(key="head").set_value(2).run()
    (other,), _ = chart_data(app, 2)
    assert not other["p"].equals(heat["p"])
    app.sidebar.text_area(key="text").set_value("my good lord").run()
    (short,), _ = chart_data(app, 2)
    assert len(short) == 12 * 13 // 2
    assert any("not meaningful" in w.value for w in app.warning)  # a short context is flagged


def test_changing_the_snapshot_changes_the_grid(app):
    open_page(app, "attention")
    (late,), _ = chart_data(app, 0)
    slider = app.sidebar.select_slider[0]
    assert list(slider.options) == ["step_000000", "step_000010", "step_000020"]
    slider.set_value("step_000000").run()
    (early,), _ = chart_data(app, 0)
    assert not early["normalised entropy"].equals(late["normalised entropy"])


def test_dynamics_charts_carry_the_logged_entropy_and_update_ratios(app, runs):
    open_page(app, "dynamics")
    first_layer, _ = chart_data(app, 0)
    records = [r for r in json.loads("[" + ",".join((runs / "a_rms" / "metrics.jsonl").read_text().split("\n")[:-1]) + "]")
               if "attn_entropy" in r]
    frame = first_layer[0]
    assert sorted(set(frame["step"])) == [r["step"] for r in records]
    assert sorted(frame[frame["step"] == 20]["entropy (nats)"]) == pytest.approx(
        sorted(records[-1]["attn_entropy"]["0"]))
    history = updates.from_run(runs / "a_rms")
    gwu, _ = chart_data(app, 4)
    medians = next(f for f in gwu if "u (median)" in f.columns)  # beside the band and finding rules
    last = medians[medians["step"] == 20].set_index("group")["u (median)"]
    for group, info in history.latest.groups.items():
        if info["median_log10_u"] is not None:
            assert math.log10(last[group]) == pytest.approx(info["median_log10_u"], abs=1e-9)
    table = app.dataframe[0].value
    assert len(table) == len(history.latest.parameters)


def test_lens_embeddings_and_compare_pages(app):
    open_page(app, "lens")
    (cells,), _ = chart_data(app, 0)
    assert {"top-1", "top-1 probability", "KL to final (nats)"} <= set(cells.columns)
    assert len(set(cells["layer"])) == 5  # embed + 4 blocks
    app.radio(key="lens_measure").set_value("KL to final (nats)").run()
    assert not app.exception
    open_page(app, "embeddings")
    assert len(app.dataframe[0].value) == 10
    (points,), _ = chart_data(app, 0)
    assert (points["role"] == "chosen").sum() == 1 and (points["role"] == "neighbour").sum() == 10
    open_page(app, "compare")
    assert len(app.get("vega_lite_chart")) >= 3


def test_an_mlp_run_shows_one_info_box_where_it_has_no_attention(app):
    for name in ("attention", "lens"):
        open_page(app, name, run="b_mlp" if name == "attention" else None)
        boxes = [i.value for i in app.info]
        assert len(boxes) == 1 and boxes[0].startswith("Not applicable"), boxes  # once, and not red
        assert not app.error
    open_page(app, "overview")
    assert not app.error and app.get("vega_lite_chart")


def test_a_corrupt_checkpoint_is_an_error_box_and_the_app_keeps_working(app):
    open_page(app, "attention", run="c_broken")
    assert any("truncated or corrupt" in e.value for e in app.error)
    open_page(app, "overview", run="a_rms")
    assert not app.error


def test_a_character_the_vocabulary_lacks_or_an_empty_text_is_an_error_box(app):
    open_page(app, "attention")
    app.sidebar.text_area(key="text").set_value("Zebra!").run()
    assert any("Z" in e.value for e in app.error) and not app.exception
    app.sidebar.text_area(key="text").set_value("").run()
    assert any("empty" in e.value for e in app.error)


def test_a_run_still_training_is_followed_and_a_half_written_line_tolerated(app, runs, tmp_path):
    import shutil

    live = runs / "d_live"
    shutil.copytree(runs / "a_rms", live, dirs_exist_ok=True)
    (live / ".train.lock").write_text("12345\n")  # what a trainer holds while it runs
    app.run()  # the sidebar lists the new run
    open_page(app, "dynamics", run="d_live")
    assert app.toggle(key="follow").value is True  # fresh metrics + a lock: follow by default
    before = next(c.value for c in app.caption if "records" in c.value)
    with open(live / "metrics.jsonl", "a") as f:
        entropy = {str(layer): [1.0] * 4 for layer in range(4)}  # every layer, as training logs it
        f.write(json.dumps({"step": 25, "tokens": 1, "lr": 0.05, "attn_entropy": entropy}) + "\n")
        f.write('{"step": 30, "tok')  # the trainer is mid-write
    app.run()
    assert not app.exception
    after = next(c.value for c in app.caption if "records" in c.value)
    assert before != after and after.endswith("..25")
    shutil.rmtree(live)


def test_lens_cells_show_no_top_token_where_a_layer_is_nan():
    from app.views.lens import lens_cells

    top = [{"id": 1, "piece": "b", "prob": 0.7}]
    result = {"layers": ["embed", "0_post"], "pieces": [["a", "b"]], "top_k": [[[top, top]], [[[], []]]],
              "kl_to_final_per_position": [[[0.1, 0.2]], [[None, None]]],
              "target_rank_per_position": [[[0, None]], [[None, None]]]}
    cells = lens_cells(result)
    assert list(cells["top-1"]) == ["b", "b", "(NaN)", "(NaN)"]
    assert cells["top-1 probability"].isna().tolist() == [False, False, True, True]
