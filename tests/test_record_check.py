"""One reader for every run's history (models.store.run.read_metrics_log, models.store.record_check):
hand-made malformed records of a 4-layer, 4-head run are skipped with one warning naming the
file, the line and what is wrong, counted, and never change what the doctor or the timeline say;
a diverged run's nulls stay; a Monitor's run is read the same way."""

from __future__ import annotations

import json
import logging
import math

import pytest

from models.store.record_check import RunShape, in_order, problem, run_shape
from models.store.run import read_metrics, read_metrics_log
from probes import diagnose
from probes.timeline import entropy_timeline, uniform_series_entropy

MODEL = {"family": "transformer", "n_layers": 4, "n_heads": 4, "n_ctx": 16}
SHAPE = RunShape(4, 4)
H = uniform_series_entropy(16)


def entropy(l0h0: float) -> dict[str, list[float]]:
    """Every head at half the uniform entropy but L0H0."""
    return {str(l): [l0h0 if (l, h) == (0, 0) else H / 2 for h in range(4)] for l in range(4)}


def clean_records() -> list[dict]:
    """L0H0 uniform from step 100 on."""
    return [{"step": s, "train_loss": 3.0 - s / 1000, "attn_entropy": entropy(H if s >= 100 else H / 2)}
            for s in range(0, 300, 50)]


# the malformed records, each one inserted after step 150 (as line 5)
BAD = {
    "a list": ({"step": 150, "attn_entropy": [[1, 2], [3, 4]]},
               "'attn_entropy' must map layers to per-head lists, got [[1, 2], [3, 4]]"),
    "layer 7": ({"step": 150, "attn_entropy": {"7": [1.0] * 4}},
                "'attn_entropy' has layers ['7'], not those of the run's 4-layer model (0, 1, 2, 3)"),
    "9 heads": ({"step": 150, "attn_entropy": {str(l): [1.0] * 9 for l in range(4)}},
                "'attn_entropy' of layer 0 has 9 values for 4 heads"),
    "a missing layer": ({"step": 150, "attn_entropy": {str(l): [1.0] * 4 for l in (0, 2, 3)}},
                        "'attn_entropy' has layers ['0', '2', '3'], not those of the run's 4-layer model"),
    "a string": ({"step": 150, "attn_entropy": {**entropy(1.0), "1": ["bad", None, 1, 1]}},
                 "'attn_entropy' of layer 1 holds 'bad', not a number"),
    "a negative entropy": ({"step": 150, "attn_entropy": entropy(-1.0)},
                           "'attn_entropy' of layer 0 holds a negative entropy (-1.0)"),
    "a text loss": ({"step": 150, "train_loss": "3.1"}, "'train_loss' must be a number or null, got '3.1'"),
    "a NaN step": ('{"step": NaN, "train_loss": 1.0}', "'step' must be a non-negative integer, got nan"),
    "an infinite step": ('{"step": Infinity}', "'step' must be a non-negative integer, got inf"),
    "a step going back": ({"step": 20, "attn_entropy": entropy(1.0)},
                          "step 20 is out of order (after step 150 and before step 200): steps must not go back"),
    "a step far ahead": ({"step": 10 ** 6, "attn_entropy": entropy(1.0)},
                         "step 1000000 is out of order (after step 150 and before step 200)"),
}


def write_run(path, records, bad=None):
    path.mkdir(parents=True, exist_ok=True)
    (path / "run.json").write_text(json.dumps({"model": MODEL}))
    lines = [json.dumps(r) for r in records]
    if bad is not None:
        lines.insert(4, bad if isinstance(bad, str) else json.dumps(bad))
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("case", list(BAD))
def test_a_malformed_record_is_skipped_with_file_line_and_why_and_counted(case, tmp_path, caplog):
    record, why = BAD[case]
    run = write_run(tmp_path / "run", clean_records(), record)
    with caplog.at_level(logging.WARNING, logger="models.store.run"):
        log = read_metrics_log(run)
    assert log.records == clean_records()
    assert [s.line for s in log.skipped] == [5] and why in log.skipped[0].reason
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and warned[0].startswith(f"{run / 'metrics.jsonl'}: skipping line 5 (") and why in warned[0]
    assert log.skipped_text() == f"1 malformed record of {run / 'metrics.jsonl'} skipped (line 5)"


@pytest.mark.parametrize("case", ["a list", "layer 7", "9 heads"])
def test_the_doctor_and_the_timeline_answer_as_on_the_clean_run(case, tmp_path):
    clean = write_run(tmp_path / "clean", clean_records())
    bad = write_run(tmp_path / "bad", clean_records(), BAD[case][0])
    before, after = diagnose.run(clean), diagnose.run(bad)
    assert [f.to_dict() for f in after.findings] == [f.to_dict() for f in before.findings]
    uniform = next(f for f in after.findings if f.code == "uniform_heads")
    assert uniform.step == 100 and (before.skipped_records, after.skipped_records) == (0, 1)
    assert after.to_dict()["skipped_records"] == 1
    assert "read from metrics.jsonl; 1 malformed record skipped)" in after.format().splitlines()[0]
    log = read_metrics_log(bad)
    timeline = entropy_timeline(log.records, 16, skipped=len(log.skipped))
    assert timeline.uniform[0][0] == 100 and timeline.to_dict()["skipped"] == 1


def test_a_diverged_runs_nulls_and_nans_stay_and_int_layer_keys_are_layers():
    diverged = {"step": 5, "train_loss": None, "val_loss": float("nan"),
                "attn_entropy": {"0": [0.1, None, 0.2, 0.3], "1": [None] * 4, "2": [float("inf")] * 4, "3": [0.0] * 4},
                "resid_rms": {"0": 1.0, "1": None, "2": None, "3": None}, "diverged": {"reason": "NaN"},
                "gwu": {"W_E": {"g": None, "w": None, "u": None}}, "anything_else": "kept as it is"}
    assert problem(diverged, SHAPE) is None
    assert problem({"step": 1, "attn_entropy": {i: [0.5] * 4 for i in range(4)}}, SHAPE) is None
    assert problem({"step": 1, "resid_rms": {"0": [1.0]}}, RunShape(1, 1)) == \
        "'resid_rms' of layer 0 must be a number or null, got [1.0]"
    assert problem({"step": 1, "gwu": {"W_E": {"g": "x"}}}) == "'gwu' of W_E must map fields to numbers, got {'g': 'x'}"


def test_the_shape_comes_from_the_config_and_without_one_the_record_must_agree_with_itself():
    assert run_shape(MODEL) == SHAPE and run_shape({"family": "mlp", "n_ctx": 3}) == RunShape(0, 0)
    assert run_shape(None) is None and run_shape({"family": "transformer"}) is None
    assert problem({"step": 0, "attn_entropy": {"0": [1.0]}}, RunShape(0, 0)) == \
        "'attn_entropy' is logged, but the run's model has no attention layers"
    assert problem({"step": 0, "attn_entropy": {"0": [1.0, 1.0], "1": [1.0]}}) == \
        "'attn_entropy' of layer 1 has 1 values for 2 heads"
    assert problem({"step": 0, "attn_entropy": {"1": [1.0]}}).startswith("'attn_entropy' has layers ['1'], not those "
                                                                         "of layers numbered from 0")


def test_a_run_without_run_json_is_checked_against_its_snapshot_config(tmp_path):
    run = write_run(tmp_path / "run", clean_records(), BAD["9 heads"][0])
    (run / "run.json").unlink()
    (run / "step_000250").mkdir()
    (run / "step_000250" / "config.json").write_text(json.dumps({"format_version": 1, "model": MODEL}))
    assert [s.line for s in read_metrics_log(run).skipped] == [5]


def test_steps_keep_the_longest_run_in_order_and_redone_steps_stay():
    assert sorted(in_order([0, 50, 100, 10 ** 6, 150, 200])) == [0, 1, 2, 4, 5]
    assert sorted(in_order([5, 0, 1, 2])) == [1, 2, 3]
    assert sorted(in_order([0, 10, 10, 20])) == [0, 1, 2, 3]  # one step logged twice: both read
    assert in_order([]) == set()


def test_each_bad_record_is_warned_about_once_however_often_it_is_read(tmp_path, caplog):
    run = write_run(tmp_path / "run", clean_records(), BAD["9 heads"][0])
    with caplog.at_level(logging.WARNING, logger="models.store.run"):
        for _ in range(3):  # the app rereads on every rerun, a Monitor's doctor every few steps
            assert len(read_metrics_log(run).skipped) == 1
    assert sum("skipping line 5" in r.getMessage() for r in caplog.records) == 1


def test_a_monitors_run_is_read_through_the_same_check(tmp_path):
    import torch

    from models import build_model, get_preset
    from train.monitor import Monitor

    torch.manual_seed(0)
    model = build_model(get_preset("transformer4_rms_small", d_vocab=8, n_layers=2, n_heads=2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    tokens = torch.randint(0, 8, (2, 16))
    with Monitor(model, optimizer, tmp_path / "run", log_every=1, eval_every=2, eval_tokens=tokens,
                 report=False) as monitor:
        for step in range(3):
            model(tokens).float().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            monitor.log(step, train_loss=1.0)
        monitor.flush()
        with open(tmp_path / "run" / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": 2, "attn_entropy": {"0": [1.0] * 9, "1": [1.0] * 9}}) + "\n")
        assert [r["step"] for r in monitor.records] == [0, 1, 2]
        assert all(len(r["attn_entropy"]["0"]) == 2 for r in monitor.records if "attn_entropy" in r)
    assert diagnose.run(tmp_path / "run").skipped_records == 1
    assert not math.isnan(read_metrics(tmp_path / "run")[0]["train_loss"])


def test_a_last_line_still_being_written_is_not_a_malformed_record(tmp_path):
    """A trainer mid-append leaves a last line without its newline: not malformed (the app follows
    live runs); the same broken line with its newline after it is."""
    from models.store.run import read_metrics_log

    good = '{"step": 0, "train_loss": 4.0}\n{"step": 10, "train_loss": 3.0}\n'
    (tmp_path / "metrics.jsonl").write_text(good + '{"step": 20, "train_lo')
    log = read_metrics_log(tmp_path)
    assert [r["step"] for r in log.records] == [0, 10] and log.skipped == [] and log.skipped_text() is None
    (tmp_path / "metrics.jsonl").write_text(good + '{"step": 20, "train_lo\n')
    log = read_metrics_log(tmp_path)
    assert [s.line for s in log.skipped] == [3] and "1 malformed record" in log.skipped_text()
