"""attn_logit_growth tells heads whose scores are still running away (a warning with QK-norm as
the fix) from heads that grew ten-fold while learning to attend sharply and then levelled off
(an info with nothing to fix: the shipped Adam run's L3H2, 2.3 -> 34 and flat)."""

from __future__ import annotations

import math

from probes import diagnose
from probes.doctor.rules_internals import recent_growth
from tests.test_diagnose import write_run


def records(values: list[float]) -> list[dict]:
    return [{"step": 100 * i, "val_loss": 4.0 - 0.2 * i, "attn_logit_max": {"0": [v, 1.0]}}  # a loss that learns
            for i, v in enumerate(values)]


def growth(run) -> diagnose.Finding:
    return next(f for f in diagnose.run(run).findings if f.code == "attn_logit_growth")


def test_recent_growth_compares_the_last_value_with_the_one_a_quarter_of_the_run_back():
    pick = lambda r: r["attn_logit_max"]["0"][0]  # noqa: E731
    # steps 0..800: the quarter starts at step 600, whose value is 30; the last is 33
    assert recent_growth(records([2, 4, 8, 16, 24, 28, 30, 32, 33]), pick) == 33 / 30
    assert recent_growth(records([2, 60]), pick) == 30.0  # two records: the last against the first
    assert recent_growth(records([5]), pick) == math.inf  # one record: nothing to compare


def test_heads_still_growing_are_warned_about_with_qk_norm(tmp_path):
    found = growth(write_run(tmp_path / "g", records([2, 3, 5, 8, 13, 21, 34, 55, 89])))
    assert found.severity == "warning" and "--set qk_norm=rms" in found.fix
    assert found.evidence["latest_quarter_growth"] == 89 / 34 and found.step == 500  # 21 >= 10 x 2


def test_heads_that_levelled_off_are_an_info_with_no_fix(tmp_path):
    found = growth(write_run(tmp_path / "l", records([2, 4, 8, 16, 24, 28, 30, 32, 33])))
    assert found.severity == "info" and found.fix == "" and "levelled off" in found.title
    d = diagnose.run(tmp_path / "l")
    assert d.verdict == "healthy" and "what to try" not in d.format()  # nothing to fix


def test_heads_that_levelled_off_far_past_a_sharp_heads_scores_are_still_a_warning(tmp_path):
    found = growth(write_run(tmp_path / "r", records([2.5, 61, 7.5e4, 2.4e5, 2.8e5, 3.9e5, 3.6e5, 3.9e5, 3.8e5])))
    assert found.evidence["latest_quarter_growth"] < 2 and found.severity == "warning"  # the sweep's lr 0.3
