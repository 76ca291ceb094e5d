"""A resume drops only the records logged after the snapshot it continues from; every other line of
metrics.jsonl stays as it was, a malformed one too (issue 37: 5 lines became 3, a damaged line and
its neighbour's data lost)."""

from __future__ import annotations

import json

from models.store.run import trim_metrics


def test_a_resume_drops_the_redone_steps_and_keeps_every_other_line(tmp_path):
    lines = [json.dumps({"step": 0, "train_loss": 4.2}), "{not json", json.dumps({"step": 10, "train_loss": 3.1}),
             json.dumps({"step": "twenty"}), json.dumps({"step": 20, "train_loss": 2.9}),
             json.dumps({"step": 30, "train_loss": 2.8})]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    trim_metrics(tmp_path, 10)
    assert (tmp_path / "metrics.jsonl").read_text().splitlines() == lines[:4]


def test_nothing_after_the_step_leaves_the_file_untouched(tmp_path):
    text = json.dumps({"step": 0}) + "\n" + "garbage\n"
    (tmp_path / "metrics.jsonl").write_text(text)
    before = (tmp_path / "metrics.jsonl").stat().st_mtime_ns
    trim_metrics(tmp_path, 5)
    assert (tmp_path / "metrics.jsonl").read_text() == text
    assert (tmp_path / "metrics.jsonl").stat().st_mtime_ns == before
    trim_metrics(tmp_path / "missing", 5)  # no run yet: nothing to trim
