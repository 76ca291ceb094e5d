"""The Compare page's run overlay (issue 20), in AppTest on the shipped runs: every line carries the
values its run's metrics.jsonl logged (losses, learning rate, tokens seen, attention entropy) or
that probes.updates reads from it (median u per group), the config diff lists exactly the run.json
fields that differ, a diverged run is drawn with its first NaN marked, A and B may be any snapshot
of any run, and a lone snapshot or a run without metrics is an info line. Expected values are read
from the files here, never typed in."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
from chart_kit import frames, titles

REPO = Path(__file__).resolve().parent.parent
APP = REPO / "app" / "main.py"
SHIPPED = REPO / "checkpoints"
SGD, ADAM, NAN_RUN = "shakespeare_rms4", "shakespeare_rms4_adam", "transformer4_nan"


@pytest.fixture
def start(monkeypatch):
    """start(roots, run): the Compare page with only these run roots, `run` chosen in the sidebar."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    st.cache_data.clear()
    st.cache_resource.clear()  # caches outlive an AppTest

    def open_compare(roots: list[Path], run: str):
        monkeypatch.setenv("SCRATCHSCOPE_RUNS", os.pathsep.join(map(str, roots)))
        monkeypatch.setenv("SCRATCHSCOPE_NO_SHIPPED", "1")
        at = AppTest.from_file(str(APP), default_timeout=240)
        at.query_params.update({"run": run})
        at.run()
        at.switch_page("views/compare.py").run()
        assert not at.exception, [e.value for e in at.exception]
        assert not [e.value for e in at.error], [e.value for e in at.error]
        return at
    return open_compare


def logged(run: str) -> list[dict]:
    """The run's records by step, the last of a step kept (as a resumed run is read)."""
    kept = {}
    for line in (SHIPPED / run / "metrics.jsonl").read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            kept[record["step"]] = record
    return [kept[s] for s in sorted(kept)]


def chart(at, title: str):
    for c in at.get("vega_lite_chart"):
        if title in titles(json.loads(c.proto.spec)):
            return c
    raise AssertionError(f"no chart titled {title!r}")


def rows_of(at, title: str, column: str):
    """The data of the chart titled `title` that has `column`."""
    return next(f for f in frames(chart(at, title)) if column in f.columns)


def line(frame, run: str, y: str, **where) -> list[tuple[int, float]]:
    """(step, y) of one run's line, in step order."""
    mine = frame[frame["run"] == run]
    for key, value in where.items():
        mine = mine[mine[key] == value]
    mine = mine.sort_values("step")
    return list(zip(mine["step"].tolist(), mine[y].tolist()))


def expected(run: str, key: str) -> list[tuple[int, float]]:
    return [(r["step"], math.nan if r[key] is None else r[key]) for r in logged(run) if key in r]


def same(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> bool:
    """The same steps, and values equal to float precision (NaN where the log holds null)."""
    return len(got) == len(want) > 0 and [s for s, _ in got] == [s for s, _ in want] and all(
        (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b) for (_, a), (_, b) in zip(got, want))


def flat(config: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in config.items():
        out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def test_two_runs_overlaid_carry_their_logged_losses_lr_entropy_and_u(start):
    from probes import updates

    at = start([SHIPPED / SGD, SHIPPED / ADAM], SGD)
    runs = at.multiselect(key=f"overlay_runs:{SGD}")
    assert runs.value == [SGD, ADAM]  # the sidebar's run and the next with its preset
    loss = rows_of(at, "loss (solid: train, dashed: val)", "loss")
    lr = rows_of(at, "learning rate (as scheduled)", "learning rate")
    for run in (SGD, ADAM):
        assert same(line(loss, run, "loss", curve="train loss"), expected(run, "train_loss"))
        assert same(line(loss, run, "loss", curve="val loss"), expected(run, "val_loss"))
        assert same(line(lr, run, "learning rate"), expected(run, "lr"))
        groups = updates.from_run(SHIPPED / run).group_records()
        for group in {g["group"] for g in groups}:
            got = line(rows_of(at, group, "median u"), run, "median u")
            want = [(g["step"], g["median_log10_u"]) for g in groups if g["group"] == group]
            assert [s for s, _ in got] == [s for s, _ in want], group
            assert [math.log10(u) for _, u in got] == pytest.approx([m for _, m in want], abs=1e-9), group
        n_ctx = json.loads((SHIPPED / run / "run.json").read_text())["model"]["n_ctx"]
        uniform = math.lgamma(n_ctx + 1) / n_ctx  # ln(n!)/n, uniform attention's mean row entropy
        layer1 = [(r["step"], sum(r["attn_entropy"]["1"]) / len(r["attn_entropy"]["1"]) / uniform)
                  for r in logged(run) if "attn_entropy" in r]
        assert same(line(rows_of(at, "layer 1", "entropy / uniform"), run, "entropy / uniform"), layer1)
    spec = json.loads(chart(at, "loss (solid: train, dashed: val)").proto.spec)
    colour = spec["layer"][0]["encoding"]["color"]
    assert colour["field"] == "run" and colour["scale"]["domain"] == [SGD, ADAM]  # one colour per run, named

    at.selectbox(key="overlay_head").set_value("head 2").run()
    head2 = [(r["step"], r["attn_entropy"]["3"][2]) for r in logged(ADAM) if "attn_entropy" in r]
    at.toggle(key="overlay_entropy_norm").set_value(False).run()
    assert same(line(rows_of(at, "layer 3", "entropy (nats)"), ADAM, "entropy (nats)"), head2)

    at.radio(key="overlay_x").set_value("tokens seen").run()
    loss = rows_of(at, "loss (solid: train, dashed: val)", "loss")
    for run in (SGD, ADAM):
        train = loss[(loss["run"] == run) & (loss["curve"] == "train loss")].sort_values("step")
        assert train["tokens"].tolist() == [r["tokens"] for r in logged(run) if "train_loss" in r]
    spec = json.loads(chart(at, "loss (solid: train, dashed: val)").proto.spec)
    assert spec["layer"][0]["encoding"]["x"]["field"] == "tokens"

    at.slider(key="overlay_smoothing").set_value(0.6).run()
    at.radio(key="overlay_y").set_value("log").run()
    loss = rows_of(at, "loss (solid: train, dashed: val)", "smoothed")
    train = loss[(loss["run"] == ADAM) & (loss["curve"] == "train loss")].sort_values("step")
    last, ema = 0.0, []
    for n, value in enumerate((v for _, v in expected(ADAM, "train_loss")), start=1):  # TensorBoard's, by hand
        last = 0.6 * last + 0.4 * value
        ema.append(last / (1 - 0.6 ** n))
    assert train["smoothed"].tolist() == pytest.approx(ema)  # each run's curve smoothed on its own
    spec = json.loads(chart(at, "loss (solid: train, dashed: val)").proto.spec)
    assert [layer["encoding"]["y"]["scale"]["type"] for layer in spec["layer"][:2]] == ["log", "log"]


def test_the_config_diff_lists_exactly_the_fields_that_differ(start):
    at = start([SHIPPED / SGD, SHIPPED / ADAM], SGD)
    configs = {run: flat(json.loads((SHIPPED / run / "run.json").read_text())) for run in (SGD, ADAM)}
    fields = list(dict.fromkeys([*configs[SGD], *configs[ADAM]]))
    differ = [f for f in fields if configs[SGD].get(f, "absent") != configs[ADAM].get(f, "absent")]
    launch = {"argv", "command", "started"}  # how each run was started: shown on request
    table = at.dataframe[0].value
    assert list(table.index) == [f for f in differ if f.split(".")[0] not in launch]
    assert "train.optimizer" in table.index and table.loc["train.lr", ADAM] == json.dumps(configs[ADAM]["train.lr"])
    for field in table.index:
        for run in (SGD, ADAM):
            value = configs[run].get(field)
            assert table.loc[field, run] == ("(absent)" if field not in configs[run] else
                                             value if isinstance(value, str) else json.dumps(value))
    at.toggle(key="overlay_launch").set_value(True).run()
    assert list(at.dataframe[0].value.index) == differ

    at.multiselect(key=f"overlay_runs:{SGD}").set_value([SGD]).run()
    assert any("two or more runs" in i.value for i in at.info) and not at.dataframe


def test_a_diverged_run_overlaid_marks_its_first_nan(start):
    at = start([SHIPPED / NAN_RUN, SHIPPED / SGD], NAN_RUN)
    at.multiselect(key=f"overlay_runs:{NAN_RUN}").set_value([NAN_RUN, SGD]).run()
    assert not at.exception and not at.error
    records = logged(NAN_RUN)
    first_bad = min(r["step"] for r in records
                    for key in ("train_loss", "val_loss") if key in r and not math.isfinite(r[key] or math.nan))
    loss = chart(at, "loss (solid: train, dashed: val)")
    rules = next(f for f in frames(loss) if "what" in f.columns)
    assert rules["run"].tolist() == [NAN_RUN] and rules["step"].tolist() == [first_bad]
    values = rows_of(at, "loss (solid: train, dashed: val)", "loss")
    assert same(line(values, NAN_RUN, "loss", curve="val loss"), expected(NAN_RUN, "val_loss"))  # NaN kept, not dropped
    broke = next(r for r in records if r.get("diverged"))
    assert any(w.value.startswith(f"{NAN_RUN} diverged at step {broke['step']}") for w in at.warning)
    nan_layers = sorted(int(layer) for layer, heads in records[-1]["attn_entropy"].items() if None in heads)
    for layer in nan_layers:
        marks = next(f for f in frames(chart(at, f"layer {layer}")) if "what" in f.columns)
        assert marks["step"].tolist() == [records[-1]["step"]]


def test_any_snapshot_of_another_run_can_be_b(start):
    at = start([SHIPPED / SGD, SHIPPED / ADAM], SGD)
    b = at.selectbox(key="cmp_b")
    for run in (SGD, ADAM):
        snaps = sorted(p.name for p in (SHIPPED / run).iterdir() if p.name.startswith("step_"))
        assert [o for o in b.options if o.startswith(f"{run} / ")] == [f"{run} / {s}" for s in snaps]
    middle = sorted(p for p in (SHIPPED / ADAM).iterdir() if p.name.startswith("step_"))[1]  # not the last
    b.set_value(f"{ADAM} / {middle.name}").run()
    assert not at.exception and not at.error
    step = int(middle.name.split("_")[1])
    val = next(r["val_loss"] for r in logged(ADAM) if r["step"] == step and "val_loss" in r)
    assert any(m.value == f"**{ADAM} / {middle.name}**: val loss {val:.3f}" for m in at.markdown)
    grids = [c for c in at.get("vega_lite_chart") if "verdict" in frames(c)[0].columns]
    assert len(grids) == 2


def test_a_lone_snapshot_and_a_run_without_metrics_are_info_lines(start, tmp_path):
    quiet = tmp_path / "quiet_run"
    shutil.copytree(SHIPPED / "mha4", quiet)
    (quiet / "metrics.jsonl").write_text("")  # training started, nothing logged yet
    lone = SHIPPED / "char_mlp" / "step_000000"
    at = start([lone, quiet, SHIPPED / "mha4"], "char_mlp/step_000000")
    assert any("lone snapshot" in i.value for i in at.info)
    overlay = at.multiselect(key="overlay_runs:char_mlp/step_000000")
    assert overlay.value == [] and set(overlay.options) == {"quiet_run", "mha4"}  # a snapshot is no run
    overlay.set_value(["quiet_run", "mha4"]).run()
    assert not at.exception and not at.error
    assert any(i.value.startswith("No metrics yet from quiet_run") for i in at.info)
    loss = rows_of(at, "loss (solid: train, dashed: val)", "loss")
    assert set(loss["run"]) == {"mha4"}


# --------------------------------------------------------------------------- the pure row builders


def test_the_default_second_run_shares_the_preset_else_the_family_else_comes_next():
    from app.overlay_data import default_runs

    families = {"a": ("p1", "transformer"), "b": ("p2", "mlp"), "c": ("p2", "transformer"), "d": ("p1", "mlp")}
    assert default_runs("a", families) == ["a", "d"]  # same preset, though later than a same-family run
    assert default_runs("c", families) == ["c", "b"]  # the search wraps after the last run
    assert default_runs("b", {"b": (None, "mlp"), "x": (None, "transformer"), "y": (None, "mlp")}) == ["b", "y"]
    assert default_runs("b", {"b": (None, None), "x": ("q", "transformer")}) == ["b", "x"]
    assert default_runs("b", {"b": (None, None)}) == ["b"]
    assert default_runs(None, families) == [] and default_runs("lone/step_0", families) == []
    # a user's GPT beside our transformers and a run of its own class: its own class first
    kin = {"mine": (None, "GPT", "transformer"), "ours": ("mha4", None, "transformer"), "again": (None, "GPT", "transformer")}
    assert default_runs("mine", kin) == ["mine", "again"] and default_runs("ours", kin) == ["ours", "again"]  # the next transformer, wrapping


def test_entropy_rows_average_the_heads_and_a_nan_head_makes_the_mean_nan():
    from app.overlay_data import entropy_rows, first_nonfinite

    records = [{"step": 0, "tokens": 0, "attn_entropy": {"0": [1.0, 3.0], "1": [2.0]}},
               {"step": 4, "tokens": 40, "attn_entropy": {"0": [None, 3.0], "1": [None]}}]
    mean = entropy_rows("r", records, None, 2.0, "h")
    assert [(r["layer"], r["step"], r["tokens"]) for r in mean] == [(0, 0, 0), (1, 0, 0), (0, 4, 40), (1, 4, 40)]
    assert [r["h"] for r in mean][:2] == [1.0, 1.0] and all(math.isnan(r["h"]) for r in mean[2:])
    head1 = entropy_rows("r", records[:1], 1, None, "h")
    assert [(r["layer"], r["h"]) for r in head1] == [(0, 3.0)]  # layer 1 has no head 1
    marks = first_nonfinite(mean, "h")
    assert [(m["run"], m["step"], m["tokens"]) for m in marks] == [("r", 4, 40), ("r", 4, 40)]  # one per line


def test_the_config_diff_keeps_types_apart_and_says_absent():
    from app.overlay_data import ABSENT, config_diff

    a = {"train": {"lr": 5, "betas": [0.9, 0.99]}, "model": {"n": 2}, "command": "x"}
    b = {"train": {"lr": "5", "betas": [0.9, 0.99]}, "model": {"n": 2, "bias": False}, "command": "y"}
    assert config_diff({"a": a, "b": b}) == [{"field": "train.lr", "a": "5", "b": "5"},
                                             {"field": "model.bias", "a": ABSENT, "b": "false"}]
    assert [r["field"] for r in config_diff({"a": a, "b": b}, launch=True)] == ["train.lr", "command", "model.bias"]
    assert config_diff({"a": a, "b": dict(a)}) == []
