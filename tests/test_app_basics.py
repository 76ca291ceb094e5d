"""The app as a daily tool (AppTest): a diverged run and a run with NaN weights render on every
page with NaN cells drawn as NaN, typed paths are selected at once or refused with a message,
`?run=` links jump in or say the name is unknown, and the landing view lists the runs."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from app_kit import open_app

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "checkpoints"
PAGES = ["home", "overview", "attention", "dynamics", "embeddings", "lens", "compare"]
TRACEBACK_BOX = re.compile(r"^[A-Za-z]+(Error|Exception): ")  # the page decorator's box for an exception


@pytest.fixture
def start(monkeypatch):
    """start(roots, **query): the app on these run roots only (shipped runs not listed)."""
    return lambda roots, **query: open_app(monkeypatch, roots, **query)


@pytest.fixture(scope="module")
def nan_weights(tmp_path_factory) -> Path:
    """mha4 whose last snapshot has NaN in one attention weight (saved properly: hashes match)."""
    import torch

    from models.checkpoint import load_checkpoint, save_snapshot

    run = tmp_path_factory.mktemp("nanw") / "mha4_nan_weights"
    shutil.copytree(SHIPPED / "mha4", run)
    last = run / "step_002000"
    snap = load_checkpoint(last)
    with torch.no_grad():
        snap.model.blocks[0].attention.W_QKV[0, 1].fill_(float("nan"))
    save_snapshot(last, snap.model, snap.tokenizer, step=2000)
    return run


def datasets(chart) -> list:
    return [pa.ipc.open_stream(d.data.data).read_all().to_pandas() for d in chart.proto.datasets]


def no_traceback_box(at, page: str) -> None:
    assert not at.exception, (page, [e.value for e in at.exception])
    boxes = [e.value for e in at.error if TRACEBACK_BOX.match(e.value)]
    assert not boxes, (page, boxes)


@pytest.mark.parametrize("run", ["transformer4_nan", "mha4_nan_weights"])
def test_a_nan_run_renders_on_every_page(start, nan_weights, run):
    at = start([SHIPPED / "transformer4_nan", nan_weights], run=run)
    assert at.sidebar.selectbox(key="run").value == run
    for page in PAGES:
        at.switch_page(f"views/{page}.py").run()
        no_traceback_box(at, page)
    if run == "transformer4_nan":  # its layers 1 to 3 are NaN (its card): grid cells say so, never blank
        at.switch_page("views/attention.py").run()
        grid = datasets(at.get("vega_lite_chart")[0])[0]
        nan = grid[grid["NaN"] == "NaN"]
        assert sorted(set(nan["layer"])) == [1, 2, 3] and len(nan) == 12
        assert nan["normalised entropy"].isna().all() and nan["text"].str.startswith("NaN").all()
        spec = json.loads(at.get("vega_lite_chart")[0].proto.spec)
        assert any(layer.get("encoding", {}).get("color", {}).get("field") == "NaN" for layer in spec["layer"])


def test_the_lens_grid_draws_nan_cells_as_nan(start):
    at = start([SHIPPED / "transformer4_nan"], run="transformer4_nan")
    at.switch_page("views/lens.py").run()
    no_traceback_box(at, "lens")
    cells = datasets(at.get("vega_lite_chart")[0])[0]
    nan = cells[cells["NaN"] == "NaN"]
    assert set(nan["layer"]) >= {"2_post", "3_post"}  # their own logits are NaN
    assert (cells[cells["layer"] == "3_post"]["top-1"] == "(NaN)").all()
    assert (cells[cells["layer"] == "embed"]["top-1"] != "(NaN)").all()
    assert any("(NaN)" in c.value for c in at.caption)
    kl = datasets(at.get("vega_lite_chart")[1])[0]  # every layer's KL is NaN (the final layer is)
    assert (kl["NaN"] == "NaN").all()


def test_lens_cells_take_nan_probabilities_or_an_empty_top_k():
    from app.views.lens import lens_cells, with_nan

    top = [{"id": 1, "piece": "b", "prob": 0.7}]
    nan_probs = [{"id": 2, "piece": "c", "prob": None}]
    result = {"layers": ["embed", "0_post", "1_post"], "pieces": [["a", "b"]],
              "top_k": [[[top, top]], [[[], []]], [[nan_probs, nan_probs]]],
              "kl_to_final_per_position": [[[0.1, 0.2]], [[None, None]], [[None, None]]],
              "target_rank_per_position": [[[0, None]], [[None, None]], [[None, None]]]}
    cells = lens_cells(result)
    assert list(cells["top-1"]) == ["b", "b", "(NaN)", "(NaN)", "(NaN)", "(NaN)"]
    assert cells["top-1 probability"].isna().tolist() == [False, False, True, True, True, True]
    ranks = with_nan(cells, "rank of the true next token")["NaN"].tolist()
    assert ranks == ["", "", "NaN", "", "NaN", ""]  # the last position has no next token: not NaN


def test_compare_keeps_a_nan_runs_kl_and_the_whole_head_grid(start):
    at = start([SHIPPED / "transformer4_nan", SHIPPED / "shakespeare_gpt"], run="transformer4_nan")
    at.switch_page("views/compare.py").run()
    at.selectbox(key="cmp_b").set_value("shakespeare_gpt / step_001500").run()
    no_traceback_box(at, "compare")
    charts = at.get("vega_lite_chart")
    kl = datasets(charts[-1])[0]
    a, b = "A: transformer4_nan / step_000005", "B: shakespeare_gpt / step_001500"  # the lines name their snapshots
    assert set(kl["run"]) == {a, b}
    assert (kl[kl["run"] == a]["NaN"] == "NaN").all() and (kl[kl["run"] == b]["NaN"] == "").all()
    grids = [c for c in charts if "verdict" in datasets(c)[0].columns]  # A's and B's, after the run overlay
    gpt = datasets(grids[1])[0]
    assert sorted(set(gpt["head"])) == list(range(6))
    assert grids[1].proto.use_container_width or "fit" in json.dumps(json.loads(grids[1].proto.spec).get("autosize"))


def test_a_typed_snapshot_is_selected_at_once_under_a_label_that_says_whose(start, tmp_path):
    at = start([SHIPPED / "mha4", SHIPPED / "char_mlp"])
    assert at.sidebar.selectbox(key="run").value == "mha4"
    at.sidebar.text_input(key="typed_path").set_value(str(SHIPPED / "char_mlp" / "step_000000")).run()
    assert at.sidebar.selectbox(key="run").value == "char_mlp/step_000000"
    assert not at.sidebar.error
    copy = tmp_path / "mha4"
    shutil.copytree(SHIPPED / "mha4", copy)
    at.sidebar.text_input(key="typed_path").set_value(str(copy)).run()
    labels = at.sidebar.selectbox(key="run").options
    assert f"mha4 ({tmp_path})" in labels and "mha4 (checkpoints)" in labels  # one name, two labels
    assert at.sidebar.selectbox(key="run").value == f"mha4 ({tmp_path})"
    at.switch_page("views/overview.py").run()
    assert at.sidebar.selectbox(key="run").value == f"mha4 ({tmp_path})"  # the pick stays


def test_a_typed_file_that_is_no_run_is_refused_with_a_message(start, tmp_path):
    at = start([SHIPPED / "mha4"])
    for text, says in [(str(REPO / "README.md"), "is not a run, a snapshot"),
                       (str(tmp_path / "missing"), "does not exist")]:
        at.sidebar.text_input(key="typed_path").set_value(text).run()
        assert any(says in e.value for e in at.sidebar.error), [e.value for e in at.sidebar.error]
        assert at.sidebar.selectbox(key="run").options == ["mha4"]  # not added to the list
    state_dict = tmp_path / "model.pt"
    state_dict.write_bytes(b"")
    at.sidebar.text_input(key="typed_path").set_value(str(state_dict)).run()
    assert any("type its preset" in e.value for e in at.sidebar.error)


def test_an_unknown_run_in_the_link_is_said_with_the_known_runs(start):
    at = start([SHIPPED / "mha4", SHIPPED / "char_mlp"], run="nosuch")
    warning = next(w.value for w in at.warning if "nosuch" in w.value)
    assert "`mha4`" in warning and "`char_mlp`" in warning
    assert at.title[0].value == "Runs"  # the landing view, not a silent jump into another run
    at.sidebar.selectbox(key="run").set_value("char_mlp").run()
    assert not any("nosuch" in w.value for w in at.warning)  # the pick replaces the stale link
    assert at.query_params["run"] == ["char_mlp"] or at.query_params["run"] == "char_mlp"


def test_a_known_run_in_the_link_opens_its_overview_and_a_later_link_switches(start):
    at = start([SHIPPED / "mha4", SHIPPED / "char_mlp"], run="char_mlp")
    assert at.title[0].value == "Overview" and at.sidebar.selectbox(key="run").value == "char_mlp"
    at.query_params["run"] = "mha4"  # the landing view's link to another run
    at.run()
    assert at.sidebar.selectbox(key="run").value == "mha4"


def test_the_landing_view_lists_each_run_with_its_state_without_loading_a_model(start, tmp_path, monkeypatch):
    import models.checkpoint

    live = tmp_path / "live_run"
    shutil.copytree(SHIPPED / "mha4", live)
    (live / ".train.lock").write_text("12345\n")
    (live / "metrics.jsonl").touch()
    blown = tmp_path / "blown_up"  # every number finite, the loss gone to 59: diverged all the same
    shutil.copytree(SHIPPED / "mha4", blown)
    last = json.loads((blown / "metrics.jsonl").read_text().splitlines()[-1])["step"]
    with (blown / "metrics.jsonl").open("a") as out:
        for k, loss in enumerate([8.0, 25.0, 59.0], start=1):
            out.write(json.dumps({"step": last + 10 * k, "train_loss": loss, "val_loss": loss}) + "\n")

    def no_load(*args, **kwargs):
        raise AssertionError("the landing view loaded a model")
    monkeypatch.setattr(models.checkpoint, "load_checkpoint", no_load)  # app.data imports it when it loads
    at = start([SHIPPED / "transformer4_nan", SHIPPED / "shakespeare_rms4_adam", live, blown])
    assert at.title[0].value == "Runs" and not at.error
    table = at.dataframe[0].value.set_index("run")
    assert list(table.index) == ["transformer4_nan", "shakespeare_rms4_adam", "live_run", "blown_up"]
    assert table.loc["blown_up", "state"] == "diverged" and table.loc["blown_up", "doctor"] == "failed"
    assert table.loc["transformer4_nan", "state"] == "diverged"
    assert table.loc["transformer4_nan", "doctor"] == "failed"
    assert table.loc["transformer4_nan", "last val loss"] == "NaN"
    assert table.loc["shakespeare_rms4_adam", "state"] == "logged"  # health is the doctor's column
    assert table.loc["shakespeare_rms4_adam", "doctor"] == "healthy"
    assert table.loc["shakespeare_rms4_adam", "steps"] == 3000
    assert table.loc["shakespeare_rms4_adam", "model"] == "transformer4_rms · 4L×4H d64"  # L×H: a transformer
    assert table.loc["transformer4_nan", "model"] == "transformer4 · 4L×4H d64"
    assert table.loc["live_run", "state"] == "training now"
    links = [p.proto for p in at.get("page_link")]
    assert sorted(l.query_string for l in links) == sorted(f"run={r}" for r in table.index)
    assert {l.page for l in links} == {"overview"}
