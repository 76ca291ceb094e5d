"""Issue 20's "heads at a glance" on the Attention page, driven by AppTest on the runs
tests/test_app.py trains: a click on a grid cell picks that head (the click is the selection
state Streamlit's frontend sends for the chart), every head of the layer as small multiples
carrying probes.entropy's patterns, the token view, the white-at-zero colour scale, labelled
positions, and the Logit lens grid that fits the page at 64 positions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from streamlit.proto.WidgetStates_pb2 import WidgetState
from test_app import app, chart_data, open_page, runs  # noqa: F401  (fixtures and helpers)

from app import charts, charts_attention, data
from models.checkpoint import load_checkpoint
from probes import entropy

REPO = Path(__file__).resolve().parent.parent
CHARTS = {"entropy": 0, "types": 1, "heatmap": 2, "rows": 3, "multiples": 4, "tokens": 5}


def click(at, chart: str, layer: int, head: int):
    """What the browser sends when a cell is clicked: the chart's selection state, as
    {"selection": {"pick": [{"head": h, "layer": l}]}}, beside every other widget's value.
    AppTest cannot click a chart, so the state goes in through its own run (AppTest._run) with
    the widget states it would send itself; the page's on_select callback does the rest."""
    element = at.get("vega_lite_chart")[CHARTS[chart]]
    assert element.proto.id and list(element.proto.selection_mode) == [charts_attention.PICK]
    states = at._tree.get_widget_states()
    states.widgets.append(WidgetState(id=element.proto.id, string_value=json.dumps(
        {"selection": {charts_attention.PICK: [{"head": head, "layer": layer}]}})))
    at._run(states)
    assert not at.exception, [e.value for e in at.exception]
    return at


def chosen(at) -> tuple[int, int, str]:
    caption = next(m.value for m in at.markdown if m.value.startswith("**L"))
    return at.selectbox(key="layer").value, at.selectbox(key="head").value, caption


def probe(at, runs):  # noqa: F811
    snap = load_checkpoint(runs / "a_rms")
    ids = torch.tensor([snap.tokenizer.encode(at.sidebar.text_area(key="text").value)[: snap.config.n_ctx]])
    return snap, ids


def heatmap_matches(at, snap, ids, layer: int, head: int) -> None:
    (heat,), _ = chart_data(at, CHARTS["heatmap"])
    pattern, _ = entropy.head_pattern(snap.model, ids, layer, head)
    for row in heat.itertuples():
        assert row.p == pytest.approx(pattern[row.q, row.k].item(), abs=1e-6)


def test_a_click_on_the_entropy_grid_picks_that_head_and_the_boxes_follow(app, runs):  # noqa: F811
    open_page(app, "attention")
    snap, ids = probe(app, runs)
    last_layer, last_head = snap.config.n_layers - 1, snap.config.n_heads - 1
    assert chosen(app)[:2] == (0, 0)
    click(app, "entropy", last_layer, last_head)
    layer, head, caption = chosen(app)
    assert (layer, head) == (last_layer, last_head) and caption.startswith(f"**L{last_layer}H{last_head}:")
    heatmap_matches(app, snap, ids, last_layer, last_head)
    _, spec = chart_data(app, CHARTS["entropy"])  # the chosen cell is outlined
    assert f"datum.layer == {last_layer} && datum.head == {last_head}" in json.dumps(spec)
    app.selectbox(key="head").set_value(0).run()  # the boxes still pick
    assert chosen(app)[:2] == (last_layer, 0)
    click(app, "entropy", last_layer, last_head)  # the same cell as before: picked again
    assert chosen(app)[:2] == (last_layer, last_head)
    click(app, "types", 1, 1)  # the head-type grid picks too
    assert chosen(app)[:2] == (1, 1) and chosen(app)[2].startswith("**L1H1:")
    click(app, "multiples", 1, 2)  # and a heatmap among the layer's small multiples
    assert chosen(app)[:2] == (1, 2)
    heatmap_matches(app, snap, ids, 1, 2)
    assert not app.error


def test_small_multiples_are_every_head_of_the_layer_titled_with_its_verdict(app, runs):  # noqa: F811
    open_page(app, "attention")
    snap, ids = probe(app, runs)
    app.selectbox(key="layer").set_value(2).run()
    (cells,), spec = chart_data(app, CHARTS["multiples"])
    facet = spec["encoding"]["facet"]
    assert facet["field"] == "head" and facet["header"]["labelExpr"].endswith("[datum.value]")
    titles = json.loads(facet["header"]["labelExpr"].removesuffix("[datum.value]"))  # head h's label: titles[h]
    (grid,), _ = chart_data(app, CHARTS["entropy"])
    assert sorted(set(cells["head"])) == list(range(snap.config.n_heads)) and set(cells["layer"]) == {2}
    for head, group in cells.groupby("head"):
        verdict = grid[(grid["layer"] == 2) & (grid["head"] == head)]["verdict"].item()
        assert titles[head] == f"L2H{head}: {verdict}"
        pattern, _ = entropy.head_pattern(snap.model, ids, 2, head)
        n = pattern.shape[0]
        assert len(group) == n * (n + 1) // 2  # the causal triangle
        for row in group.itertuples():
            assert row.p == pytest.approx(pattern[row.q, row.k].item(), abs=1e-6)


def test_the_token_view_starts_on_the_last_token_and_follows_the_chosen_query(app, runs):  # noqa: F811
    open_page(app, "attention")
    snap, ids = probe(app, runs)
    n = ids.shape[1]
    query = app.selectbox(key="attn_query")
    assert query.value == n - 1
    frames, spec = chart_data(app, CHARTS["tokens"])
    tokens, pairs = sorted(frames, key=len)  # n tokens to hover; n^2 (query, key) weights
    assert len(tokens) == n and len(pairs) == n * n
    assert tokens["token"].tolist() == [data.shown(p) for p in data.pieces(snap, ids[0].tolist())]
    hover = next(p for p in spec["params"] if p["name"] == "hover")
    assert hover["value"] == [{"q": n - 1}] and hover["select"]["on"] == "pointerover"
    pattern, _ = entropy.head_pattern(snap.model, ids, 0, 0)
    row = pairs[pairs["q"] == 3].sort_values("k")
    assert row["p"].iloc[:4].tolist() == pytest.approx(pattern[3, :4].tolist(), abs=1e-6)
    assert row["p"].iloc[4:].isna().all()  # later keys are masked (no weight), not zero
    query.set_value(3).run()
    _, spec = chart_data(app, CHARTS["tokens"])
    assert next(p for p in spec["params"] if p["name"] == "hover")["value"] == [{"q": 3}]


def scales(spec: dict) -> list[dict]:
    """Every colour scale in a (layered, faceted) spec."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            color = node.get("encoding", {}).get("color") if isinstance(node.get("encoding"), dict) else None
            if isinstance(color, dict) and "scale" in color:
                found.append(color["scale"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
    walk(spec)
    return found


def test_attention_weights_are_white_at_zero_on_every_pattern_chart(app):  # noqa: F811
    open_page(app, "attention")
    for name in ("heatmap", "multiples", "tokens"):
        _, spec = chart_data(app, CHARTS[name])
        found = scales(spec)
        assert found, name
        for scale in found:
            assert scale["domain"][0] == 0 and scale["range"][0].lower() in ("#ffffff", "white"), (name, scale)


def test_every_position_is_labelled_on_the_heatmap_axes(app):  # noqa: F811
    open_page(app, "attention")
    (heat,), spec = chart_data(app, CHARTS["heatmap"])
    n = heat["q"].max() + 1
    for channel in ("x", "y"):
        axis = spec["encoding"][channel]["axis"]
        assert "labelExpr" not in axis and axis["labelOverlap"] is False  # a few positions: all printed
        field = spec["encoding"][channel]["field"]
        assert sorted(set(heat[field]), key=lambda s: int(s.split(":")[0])) == \
            sorted(spec["encoding"][channel]["sort"], key=lambda s: int(s.split(":")[0]))
        assert len(spec["encoding"][channel]["sort"]) == n


def test_past_forty_positions_the_axes_thin_and_the_tooltip_names_each_position():
    n = 64
    labels = [f"{i}: {chr(97 + i % 26)}" for i in range(n)]
    pattern = [[1.0 / (q + 1) if k <= q else 0.0 for k in range(n)] for q in range(n)]
    spec = charts_attention.pattern_heatmap(pattern, labels, [l[-1] for l in labels], "t").to_dict()
    axis = spec["encoding"]["x"]["axis"]
    every = int(axis["title"].split("a label every ")[1].split()[0])
    assert 2 <= every <= 4 and f"% {every} == 0" in axis["labelExpr"]
    assert {"query", "key"} <= {t["field"] for t in spec["encoding"]["tooltip"]}
    (rows,) = spec["datasets"].values()
    assert {r["key"] for r in rows} == set(labels) and {r["query"] for r in rows} == set(labels)


@pytest.fixture
def shipped(monkeypatch):
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    st.cache_data.clear()
    st.cache_resource.clear()
    monkeypatch.setenv("SCRATCHSCOPE_RUNS", str(REPO / "checkpoints" / "shakespeare_gpt"))
    monkeypatch.setenv("SCRATCHSCOPE_NO_SHIPPED", "1")
    at = AppTest.from_file(str(REPO / "app" / "main.py"), default_timeout=180)
    at.run()
    return at


def test_the_lens_grid_fits_the_page_at_64_positions_on_shakespeare_gpt(shipped):
    long_text = "ROMEO:\nBut soft, what light through yonder window breaks? It is the east, and Juliet is the sun."
    shipped.sidebar.text_area(key="text").set_value(long_text).run()
    open_page(shipped, "lens")
    (cells,), spec = chart_data(shipped, 0)
    assert cells["label"].nunique() == 64  # the model's whole context
    assert spec["width"] == "container" and spec["autosize"]["type"] == "fit-x"  # the page's width, no wider
    x = spec["layer"][0]["encoding"]["x"]
    assert x["sort"] == list(dict.fromkeys(cells["label"])) and len(x["sort"]) == 64
    assert "% 2 == 0" in x["axis"]["labelExpr"]  # every other label printed (~12 px a position) ...
    tooltip = {t["field"] if isinstance(t, dict) else t for t in spec["layer"][0]["encoding"]["tooltip"]}
    assert "label" in tooltip  # ... and every position named on hover
    shipped.sidebar.text_area(key="text").set_value("ROMEO:\nBut soft").run()  # a short text: its own size
    _, spec = chart_data(shipped, 0)
    assert isinstance(spec["width"], int) and spec["width"] <= charts.FIT_PX
