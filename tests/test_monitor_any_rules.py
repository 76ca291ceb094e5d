"""The doctor's rules for models we never rebuilt (`probes.doctor.rules_growth`) on hand-written
runs: residual-rms growth judged against the run's own start, and sliding-window layers judged
against the uniform entropy of their window."""

from __future__ import annotations

import json
import math

import pytest

from probes.doctor.diagnosis import run as diagnose
from probes.doctor.rules_growth import window_uniform_entropy


def write_run(path, records, model=None):
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps({"source": "monitor", "model": model or {}, "train": {}}))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def rms_run(tmp_path, name, rms_by_step):
    records = [{"step": s, "train_loss": 3.0, "resid_rms": {"0": 1.0 + s / 100, "1": v}} for s, v in rms_by_step]
    return write_run(tmp_path / name, records)


def finding(path, code):
    return next((f for f in diagnose(path).findings if f.code == code), None)


def test_residual_rms_growing_ten_fold_and_still_growing_is_a_warning(tmp_path):
    # nanochat at 1000x its lr: 12.7 -> 3.6e5 in ten steps
    path = rms_run(tmp_path, "blowing", [(0, 12.7), (2, 30.0), (4, 140.0), (6, 2.1e3), (8, 4e4), (10, 3.6e5)])
    found = finding(path, "resid_rms_growth")
    assert found.severity == "warning" and found.step == 4  # 140 is the first value >= 127
    assert found.evidence["start"] == 12.7 and found.evidence["peak"] == 3.6e5
    assert found.where == ("layer 1",)  # layer 0 grew too, but not ten-fold
    assert "learning rate" in found.fix


def test_residual_rms_that_grew_then_levelled_off_is_an_info(tmp_path):
    path = rms_run(tmp_path, "levelled", [(0, 1.0), (100, 12.0), (200, 14.0), (300, 15.0), (400, 15.5)])
    found = finding(path, "resid_rms_growth")
    assert found.severity == "info" and found.fix == "" and found.step == 100


def test_residual_rms_under_ten_fold_says_nothing(tmp_path):
    path = rms_run(tmp_path, "healthy", [(0, 1.5), (50, 2.5), (100, 3.4), (150, 3.6)])  # a healthy run: 2.4x
    assert finding(path, "resid_rms_growth") is None


def test_window_uniform_entropy_on_paper():
    assert window_uniform_entropy(4, 2) == pytest.approx((0 + math.log(2) * 3) / 4)
    assert window_uniform_entropy(6, 6) == pytest.approx(math.lgamma(7) / 6)  # no window: ln(n!)/n


def test_a_uniform_head_of_a_sliding_window_layer_is_found_against_its_window(tmp_path):
    n, window = 32, 8
    flat = window_uniform_entropy(n, window)  # what a uniform head of the window layer logs
    full = math.lgamma(n + 1) / n
    assert flat < 0.97 * full  # the whole-context baseline would never call it uniform
    records = [{"step": s, "attn_entropy": {"0": [flat * 0.999, 0.5 * flat], "1": [0.8 * full, 0.5 * full]}}
               for s in (0, 10, 20)]
    model = {"family": "transformer", "n_ctx": n, "n_layers": 2, "n_heads": 2, "attn_windows": {"0": window}}
    found = finding(write_run(tmp_path / "w", records, model), "window_uniform")
    assert found.where == ("L0H0",) and found.severity == "info"
    without = write_run(tmp_path / "no_window", records, {**model, "attn_windows": {}})
    assert finding(without, "window_uniform") is None
