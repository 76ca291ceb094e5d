"""How many legend columns fit under a chart (app.legends.legend_columns), on paper: each column is as
wide as the longest label (symbol 16 px + gap 5 + padding 12 + 6.6 px a character), after the 60 px
left of the plot."""

from __future__ import annotations

from app.legends import legend_columns


def test_columns_that_fit_a_third_of_the_page():
    third = (820 - 32) / 3  # 262.7 px
    # 'block 1 post_1': 14 chars -> 33 + 92.4 = 125.4 px a column; (262.7 - 60) / 125.4 = 1.6 -> 1
    assert legend_columns(["block 0 post", "block 1 post_1"], third) == 1
    # 'L0H0': 33 + 26.4 = 59.4 px; 202.7 / 59.4 = 3.4 -> 3 (4 were drawn, the fourth cut)
    assert legend_columns([f"L{l}H{h}" for l in range(4) for h in range(6)], third) == 3


def test_never_more_columns_than_labels_and_at_least_one():
    assert legend_columns(["train loss"], 820) == 1
    assert legend_columns(["a" * 200], 300) == 1
    assert legend_columns(["x", "x", "y"], 820) == 2  # repeated labels are one entry
    assert legend_columns(["x"], None) == 4 and legend_columns([], 500) == 4  # unknown width: the old default
