"""A diverged run made readable (issue 29, item 6), in AppTest on the shipped transformer4_nan (its
loss climbs to ~10,000 by step 5) beside attn1_noscale (2000 steps, one layer): a loss spanning
orders of magnitude is drawn on a log axis that says so, every chart of one figure shares its x
range (which ends past the last step, so a NaN rule there is not on the border), and failures'
rules are drawn over warnings'. Expected values are read from the runs' files, never typed in."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from app_kit import open_app
from chart_kit import frames, specs

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "checkpoints"
NAN_RUN, OTHER = "transformer4_nan", "attn1_noscale"
ORDER = ["info", "warning", "failed"]  # the drawing order: a failure's rule lies on top


@pytest.fixture
def start(monkeypatch):
    """start(page): `page` on the two shipped runs only, transformer4_nan chosen."""
    return lambda page: open_app(monkeypatch, [SHIPPED / NAN_RUN, SHIPPED / OTHER], page, timeout=240, run=NAN_RUN)


def logged(run: str) -> list[dict]:
    return [json.loads(line) for line in (SHIPPED / run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def encodings(spec: dict, channel: str) -> list[dict]:
    """Every `channel` encoding in a (layered) spec."""
    found, stack = [], [spec]
    while stack:
        node = stack.pop()
        if channel in node.get("encoding", {}):
            found.append(node["encoding"][channel])
        stack += node.get("layer", [])
    return found


def x_domains(spec: dict) -> set[str]:
    return {json.dumps(x.get("scale", {}).get("domain")) for x in encodings(spec, "x") if "scale" in x}


def orders(values) -> float:
    finite = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v) and v > 0]
    return math.log10(max(finite) / min(finite))


def assert_failures_drawn_last(datasets: list) -> None:
    rules = next(f for f in datasets if "severity" in f.columns and "code" in f.columns)
    ranks = [ORDER.index(s) for s in rules["severity"]]
    assert ranks == sorted(ranks), list(rules["severity"])


def test_the_overview_draws_a_diverged_loss_on_a_log_axis_and_failures_over_warnings(start):
    at = start("overview")
    records = logged(NAN_RUN)
    span = orders([r.get(k) for r in records for k in ("train_loss", "val_loss")])
    assert span > 2  # the premise: transformer4_nan's loss spans more than two orders of magnitude
    [(spec, datasets)] = specs(at, "loss")
    assert {y["scale"].get("type") for y in encodings(spec, "y") if y.get("field") == "loss"} == {"log"}
    title = spec["layer"][0]["title"]
    assert title["subtitle"] == f"log y-axis: the values span {span:.1f} orders of magnitude"
    severities = set(next(f for f in datasets if "severity" in f.columns)["severity"])
    assert {"failed", "warning"} <= severities  # both kinds, some at the same step: the order matters
    assert_failures_drawn_last(datasets)
    [domain] = x_domains(spec)
    assert json.loads(domain)[1] > records[-1]["step"]  # the last step's rules inside the plot
    at.radio(key="loss_y").set_value("linear").run()  # the user's choice wins, and needs no note
    [(spec, _)] = specs(at, "loss")
    assert all(y["scale"].get("type") != "log" for y in encodings(spec, "y") if "scale" in y)
    assert spec["layer"][0]["title"] == "loss"


def test_compare_shares_one_x_range_across_its_small_multiples(start):
    at = start("compare")
    at.multiselect(key=f"overlay_runs:{NAN_RUN}").set_value([NAN_RUN, OTHER]).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    last = max(r["step"] for run in (NAN_RUN, OTHER) for r in logged(run))
    [(loss, _)] = specs(at, "loss (solid: train, dashed: val)")
    assert {y["scale"].get("type") for y in encodings(loss, "y") if y.get("field") == "loss"} == {"log"}
    layers = [specs(at, f"layer {layer}")[0][0] for layer in range(4)]  # attn1_noscale has layer 0 only
    groups = [spec for spec, datasets in (s for c in at.get("vega_lite_chart") for s in [
        (json.loads(c.proto.spec), frames(c))]) if any("median u" in f.columns for f in datasets)]
    assert len(groups) >= 2
    domains = set().union(*(x_domains(spec) for spec in [loss, *layers, *groups]))
    assert len(domains) == 1, domains  # layer 0 spanned 0-2000 and layers 1-3 0-5
    lo, hi = json.loads(domains.pop())
    assert lo == 0 and last < hi


def test_training_dynamics_keeps_the_nan_rule_inside_the_plot_and_failures_on_top(start):
    at = start("dynamics")
    records = logged(NAN_RUN)
    nan_step = min(r["step"] for r in records
                   if any(v is None for heads in r.get("attn_entropy", {}).values() for v in heads))
    layers = [specs(at, f"layer {layer}")[0] for layer in range(4)]
    domains = set().union(*(x_domains(spec) for spec, _ in layers))
    assert len(domains) == 1
    assert json.loads(domains.pop())[1] > nan_step  # the first NaN's rule is not drawn on the border
    for spec, datasets in layers:
        assert_failures_drawn_last(datasets)
