"""The head-type grid draws a NaN head as the entropy grid does (issue 38, item 10): a cell of the
NaN colour labelled NaN with a 'NaN' legend entry, where it was a '-' on an empty cell."""

from __future__ import annotations

import math

from app.charts import NAN_COLOUR, head_types_grid


def layers_of(spec: dict) -> list[dict]:
    return spec.get("layer", [spec])


def test_a_nan_head_is_a_labelled_cell_of_the_nan_colour():
    scores = {"previous token": [[0.9, math.nan], [0.1, 0.2]], "induction": [[0.0, math.nan], [0.5, 0.1]]}
    spec = head_types_grid(scores, "previous token").to_dict()
    layers = layers_of(spec)
    nan_layer = [l for l in layers if NAN_COLOUR in str(l.get("encoding", {}).get("color", {}))]
    assert len(nan_layer) == 1 and "datum['NaN'] == 'NaN'" in str(nan_layer[0].get("transform"))
    rows = next(iter(spec["datasets"].values()))
    texts = {(r["layer"], r["head"]): r["text"] for r in rows}
    assert texts[(0, 1)] == "NaN" and texts[(0, 0)] == "0.90"
    assert [r["NaN"] for r in rows] == ["", "NaN", "", ""]


def test_a_grid_without_nan_has_no_nan_layer():
    spec = head_types_grid({"sink": [[0.2, 0.3]]}, "sink").to_dict()
    assert NAN_COLOUR not in str(spec)
