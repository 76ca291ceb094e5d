"""Run directories (models/store/): the latest snapshot, an empty run, metrics.jsonl appended and
read back past a truncated or bad line.
"""

from __future__ import annotations

import logging

import pytest
import torch
from checkpoint_kit import model, tokenizer_for  # noqa: F401 - fixtures

from models.checkpoint import (CheckpointError, append_metrics, is_run_dir, is_snapshot_dir, latest_snapshot,
                               list_snapshots, load_checkpoint, read_metrics, save_snapshot, snapshot_name)


# --------------------------------------------------------------------------- runs


def test_run_dir_latest_snapshot(tmp_path, model):
    run = tmp_path / "run"
    assert snapshot_name(500) == "step_000500" and snapshot_name(1234567) == "step_1234567"
    for step in (0, 500, 1000):
        with torch.no_grad():
            model.W_out.fill_(step)
        save_snapshot(run / snapshot_name(step), model, tokenizer_for(model), step=step)
    (run / "notes").mkdir()
    assert is_run_dir(run) and not is_snapshot_dir(run)
    assert is_snapshot_dir(run / "step_000500") and not is_run_dir(run / "step_000500")
    assert [p.name for p in list_snapshots(run)] == ["step_000000", "step_000500", "step_001000"]
    assert latest_snapshot(run) == run / "step_001000"
    snap = load_checkpoint(run)
    assert snap.step == 1000 and snap.name == "run/step_001000"
    assert snap.model.W_out[0, 0].item() == 1000.0


def test_empty_run_dir(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text("{}")
    with pytest.raises(CheckpointError, match="run directory has no step_NNNNNN snapshots yet"):
        load_checkpoint(tmp_path / "run")


def test_metrics_append_read_and_truncated_last_line(tmp_path, caplog):
    run = tmp_path / "run"
    assert read_metrics(tmp_path) == []
    for step in range(3):
        append_metrics(run, {"step": step, "loss": 4.0 - step, "entropy": torch.tensor([0.5, 1.0])})
    records = read_metrics(run)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert records[2] == {"step": 2, "loss": 2.0, "entropy": [0.5, 1.0]}
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "lo')  # killed mid-write
    with caplog.at_level(logging.WARNING, logger="models.store.run"):
        assert [r["step"] for r in read_metrics(run)] == [0, 1, 2]
    assert "truncated last line 4" in caplog.text
    append_metrics(run, {"step": 3, "loss": float("nan")})  # drops the partial record first
    records = read_metrics(run)
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert records[3]["loss"] != records[3]["loss"]  # NaN survives


def test_metrics_bad_lines_in_the_middle_are_skipped_with_file_and_line(tmp_path, caplog):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1,,}\n{"step": "many"}\n'
                                            '[1, 2]\n{"step": -5}\n{"step": 2}\n')
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 2]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    for line in (2, 3, 4, 5):
        assert any(f"metrics.jsonl: skipping line {line} " in w for w in warnings), warnings
    assert any("'step' must be a non-negative integer, got 'many'" in w for w in warnings)
