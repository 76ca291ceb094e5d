"""The app's small decisions (issue 29, items 6 and 12), as pure functions on hand-made values:
which y axis a chart gets, the x range small multiples share, the order finding rules are drawn
in, snapshot B's first choice, a prompt's new lines shown and read back, the g/w/u table's
height, and what an error box says."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from app import axes, charts, data, overlay_data
from app.views import common, dynamics


def test_orders_spanned_reads_only_finite_positive_values():
    assert axes.orders_spanned([4.0, None, math.nan, math.inf, 9602.98]) == pytest.approx(math.log10(9602.98 / 4))
    assert axes.orders_spanned([0.0, 5.0]) is None  # no log axis has room for 0
    assert axes.orders_spanned([-1.0, 5.0]) is None
    assert axes.orders_spanned([None, math.nan]) is None
    assert axes.orders_spanned([3.0]) == 0.0


@pytest.mark.parametrize("values, log", [
    ([1.0, 100.0], False),  # exactly two orders: still linear
    ([1.0, 100.5], True),
    ([2.9, 4.2, 3.1], False),  # a healthy loss
    ([8.3, 12.4, 9603.0, math.nan], True),  # transformer4_nan's val loss
    ([0.0, 1.0, 1000.0], False),  # a log axis would drop the 0
])
def test_auto_turns_log_past_two_orders_of_magnitude_and_says_so(values, log):
    chosen = axes.choose_y(values)
    assert chosen.log is log
    span = axes.orders_spanned(values)
    assert chosen.note == (f"log y-axis: the values span {span:.1f} orders of magnitude" if log else "")


def test_the_users_choice_wins_and_a_learning_rate_prefers_log():
    spread = [1.0, 1e4]
    assert axes.choose_y(spread, "linear") == axes.YAxis(False, "")
    assert axes.choose_y([1.0, 2.0], "log") == axes.YAxis(True, "")
    assert axes.choose_y([0.05, 0.001], prefer_log=True).log  # SGD's and Adam's rates: 1.7 orders apart
    assert axes.choose_y([0.0, 0.001], prefer_log=True).log  # a warmup's 0 is left off the axis
    assert not axes.choose_y([0.0, 0.0], prefer_log=True).log
    assert not axes.choose_y([0.05, 0.001], "linear", prefer_log=True).log
    with pytest.raises(ValueError, match="'symlog'"):
        axes.choose_y(spread, "symlog")


def test_the_shared_x_range_covers_every_value_and_ends_inside_the_plot():
    lo, hi = axes.x_range([0, 5, None, 3, math.nan])
    assert lo == 0 and 5 < hi <= 5 + 5 * 0.05  # a rule at step 5 is not drawn on the border
    lo, hi = axes.x_range([7])
    assert lo == 7 < hi
    assert axes.x_range([None]) is None


def test_failures_are_drawn_after_warnings_and_info():
    marks = pd.DataFrame([{"step": 4, "code": "collapse", "severity": "failed", "title": ""},
                          {"step": 5, "code": "divergence", "severity": "failed", "title": ""},
                          {"step": 4, "code": "dead", "severity": "warning", "title": ""},
                          {"step": 0, "code": "note", "severity": "info", "title": ""}])
    ordered = charts.drawing_order(marks)
    assert list(ordered["severity"]) == ["info", "warning", "failed", "failed"]
    assert list(ordered["code"][ordered["severity"] == "failed"]) == ["collapse", "divergence"]  # stable


def test_snapshot_b_is_the_latest_of_the_second_overlaid_run():
    labels = ["nan / step_000000", "nan / step_000005", "adam / step_000000", "adam / step_002000",
              "other / step_000100"]
    assert overlay_data.snapshot_b(labels, "nan / step_000005", ["nan", "adam"]) == "adam / step_002000"
    assert overlay_data.snapshot_b(labels, "nan / step_000005", ["adam", "nan"]) == "adam / step_002000"
    assert overlay_data.snapshot_b(labels, "nan / step_000005", ["nan"]) == "nan / step_000000"
    assert overlay_data.snapshot_b(labels, "nan / step_000005", ["nan", "weights-less"]) == "nan / step_000000"
    assert overlay_data.snapshot_b(["a / x"], "a / x", []) == "a / x"


def test_a_prompts_new_lines_are_shown_and_read_back():
    text = "ROMEO:\nBut soft"
    shown = data.shown_newlines(text)
    assert "\n" not in shown and shown == f"ROMEO:{data.NEWLINE}But soft"
    assert data.real_newlines(shown) == text


def test_the_gwu_table_is_as_tall_as_its_rows_up_to_a_limit():
    assert dynamics.table_height(5) == 6 * dynamics.ROW_PX + 3  # char_mlp's five parameters, no empty rows
    assert dynamics.table_height(5) < dynamics.table_height(6)
    assert dynamics.table_height(200) == 360


def test_an_error_box_leads_with_the_message_not_a_class_name():
    from probes.errors import ProbeInputError

    said = common.error_text(ProbeInputError("the text is empty: type some text in the sidebar"))
    assert said == "the text is empty: type some text in the sidebar"
    assert common.error_text(OSError("runs/x.safetensors: truncated\nmore")) == "runs/x.safetensors: truncated"
    bug = common.error_text(KeyError("layer"))
    assert not bug.startswith("KeyError") and "KeyError" in bug and "report" in bug
