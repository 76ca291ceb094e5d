"""The app's series helpers (app/series.py) on hand-made records: values are the logged ones,
tokens per second is tokens over time between records, and the EMA is TensorBoard's, by hand."""

from __future__ import annotations

import math

import pytest

from app import series

RECORDS = [
    {"step": 0, "tokens": 0, "lr": 0.1, "val_loss": 4.0},
    {"step": 5, "tokens": 500, "lr": 0.1, "train_loss": 3.0, "step_time_ms": 20.0, "grad_norm": 2.0},
    {"step": 10, "tokens": 1000, "lr": 0.05, "train_loss": None, "step_time_ms": 50.0, "grad_norm": 1.0,
     "activations": {"blocks.0.mlp.hook_post": {"dead": 0.25, "saturated": 0.5},
                     "blocks.1.mlp.hook_post": {"dead": 0.0, "saturated": None}},
     "attn_logit_max": {"0": [1.5, 2.5], "1": [None, 4.0]}, "resid_rms": {"0": 1.0, "1": 2.0}},
    {"step": 5, "tokens": 500, "lr": 0.1, "train_loss": 2.5, "step_time_ms": 25.0},  # redone after a resume
]


def test_scalar_series_are_the_logged_values_in_step_order():
    assert series.scalar(RECORDS, "lr") == [(0, 0.1), (5, 0.1), (10, 0.05)]
    steps, values = zip(*series.scalar(RECORDS, "train_loss"))
    assert steps == (5, 10) and values[0] == 2.5 and math.isnan(values[1])  # the redone record wins; null is NaN
    assert series.scalar(RECORDS, "logit_max") == [] and not series.logged(RECORDS, "logit_max")
    assert series.rows(RECORDS, {"val loss": "val_loss"}, "loss") == [{"step": 0, "curve": "val loss", "loss": 4.0}]


def test_tokens_per_second_is_tokens_over_the_time_those_steps_took():
    # 500 tokens in 5 steps of 25 ms (the redone record), then 500 in 5 steps of 50 ms
    assert series.tokens_per_second(RECORDS) == [(5, pytest.approx(500 / 0.125)), (10, pytest.approx(500 / 0.25))]
    broken = [{"step": 0, "tokens": 0}, {"step": 2, "tokens": 10}]  # no step time logged
    assert math.isnan(series.tokens_per_second(broken)[0][1])


def test_per_layer_fields_per_head_and_per_layer():
    dead = series.per_layer(RECORDS, "activations", "dead")
    assert dead == [{"step": 10, "layer": "blocks.0.mlp.hook_post", "head": None, "value": 0.25},
                    {"step": 10, "layer": "blocks.1.mlp.hook_post", "head": None, "value": 0.0}]
    assert math.isnan(series.per_layer(RECORDS, "activations", "saturated")[1]["value"])
    logits = series.per_layer(RECORDS, "attn_logit_max")
    assert [(r["layer"], r["head"]) for r in logits] == [("0", 0), ("0", 1), ("1", 0), ("1", 1)]
    assert [r["value"] for r in logits][:2] == [1.5, 2.5] and math.isnan(logits[2]["value"])
    assert [r["value"] for r in series.per_layer(RECORDS, "resid_rms")] == [1.0, 2.0]
    assert series.layer_name("blocks.1.mlp.hook_post_1") == "block 1 post_1"
    assert series.layer_name("mlp.hook_post") == "post"


def test_ema_is_tensorboards_debiased_average_by_hand():
    w = 0.6
    values = [1.0, 3.0, float("nan"), 2.0]
    # last_1 = 0.4 * 1 = 0.4, / (1 - 0.6) = 1.0
    # last_2 = 0.6 * 0.4 + 0.4 * 3 = 1.44, / (1 - 0.36) = 2.25
    # NaN passes through and does not count
    # last_3 = 0.6 * 1.44 + 0.4 * 2 = 1.664, / (1 - 0.216) = 2.12244...
    out = series.ema(values, w)
    assert out[0] == pytest.approx(1.0) and out[1] == pytest.approx(2.25)
    assert math.isnan(out[2]) and out[3] == pytest.approx(1.664 / 0.784)
    assert series.ema(values[:2], 0.0) == values[:2]
    assert series.ema([5.0, 5.0, 5.0], 0.9) == [5.0, 5.0, 5.0]
    with pytest.raises(ValueError):
        series.ema(values, 1.0)


def test_smoothed_rows_smooth_each_curve_on_its_own():
    rows = series.rows(RECORDS, {"train": "train_loss", "lr": "lr"}, "v")
    out = series.smoothed(rows, "v", "curve", 0.5)
    lr = [r for r in out if r["curve"] == "lr"]
    assert [r["v"] for r in lr] == [0.1, 0.1, 0.05]  # raw kept
    assert [r["smoothed"] for r in lr] == pytest.approx([0.1, 0.1, (0.5 * 0.075 + 0.5 * 0.05) / 0.875])
    train = [r for r in out if r["curve"] == "train"]
    assert train[0]["smoothed"] == 2.5 and math.isnan(train[1]["smoothed"])
    assert series.normalised([{"step": 0, "e": 2.0}, {"step": 1, "e": None}], "e", 4.0, "n") == [
        {"step": 0, "e": 2.0, "n": 0.5}, {"step": 1, "e": None, "n": None}]


def test_map_labels_never_overlap_and_stay_inside_the_plot():
    import random

    from app import labels

    rng = random.Random(0)
    n = 400
    xs, ys = [rng.gauss(0, 1) for _ in range(n)], [rng.gauss(0, 1) for _ in range(n)]
    texts = [rng.choice(["a", "the", "␣king", "⏎", "queen"]) for _ in range(n)]
    order = [7, 3, *[i for i in range(n) if i not in (7, 3)]]  # the chosen token and a neighbour first
    sides = labels.place(xs, ys, texts, order, 560, 460)
    assert sides[7] is not None and sides[3] is not None
    assert 0 < sides.count(None) < n  # crowded: some left off, many drawn
    boxes = labels.boxes(xs, ys, texts, sides, 560, 460)
    assert all(labels.inside(b, 560, 460) for b in boxes)
    assert not any(labels.overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    edge = labels.place([0.0, 1.0], [0.0, 1.0], ["left", "right"], [0, 1], 560, 460)
    assert edge == ["right", "left"]  # the rightmost point's label turns left instead of leaving the plot


def test_chance_cosine_is_the_95th_percentile_of_the_nearest_random_direction():
    import torch

    from probes.neighbours import chance_cosine

    torch.manual_seed(0)
    n, d, trials = 64, 64, 2000
    q = torch.nn.functional.normalize(torch.randn(trials, 1, d), dim=-1)
    keys = torch.nn.functional.normalize(torch.randn(trials, n, d), dim=-1)
    nearest = (q * keys).sum(-1).max(-1).values
    simulated = torch.quantile(nearest, 0.95).item()
    assert chance_cosine(n, d) == pytest.approx(simulated, abs=0.03)  # the normal tail is a little heavier
    assert chance_cosine(n, d) > simulated - 0.005


def share_rows(lines: dict[str, list[float | None]]) -> list[dict]:
    return [{"step": 10 * i, "layer": name, "dead share": v} for name, values in lines.items()
            for i, v in enumerate(values)]


@pytest.mark.parametrize("lines,note", [
    # four layers at 0 but one at 0.0013 once: less than a pixel of a 200 px [0, 1] axis (0.005)
    ({"block 0 post": [0, 0, 0], "block 1 post": [0.0013, 0, 0], "block 2 post": [0, 0, 0],
      "block 3 post": [0, 0, 0]}, "all 4 layers on one line, at 0"),
    ({"a": [0.5, 0.4], "b": [0.5, 0.4]}, "all 2 layers on one line"),
    ({"a": [0.1, 0.2], "b": [0.3, 0.3], "c": [0.1, 0.2], "d": [0.3, 0.3], "e": [0.9, 0.9]},
     "a and c on one line; b and d on one line"),
    ({"a": [0.0, None], "b": [0.0, None], "c": [0.0, 0.0]}, "a and b on one line, at 0"),  # a gap is no value
    ({"a": [0.0, 0.01], "b": [0.0, 0.0]}, ""),  # two pixels apart at the second step: two lines
], ids=["near zero", "all, not at 0", "two pairs", "NaN alike", "apart"])
def test_series_drawn_as_one_line_are_named(lines, note):
    assert series.one_line_note(share_rows(lines), "dead share", "layer", 1 / 200) == note
