"""The app reviewed page by page (issue 29), what AppTest can check of it on the runs
tests/test_app.py trains: the attribution charts share one colour scale, ..."""

from __future__ import annotations

import json

from test_app import app, chart_data, fresh_app, open_page, runs  # noqa: F401  (fixtures and helpers)


def specs_titled(at, words: str) -> list[dict]:
    out = []
    for i in range(len(at.get("vega_lite_chart"))):
        _, spec = chart_data(at, i)
        if words in json.dumps([spec.get("title")] + [layer.get("title") for layer in spec.get("layer", [])]):
            out.append(spec)
    return out


def colour_of(spec: dict, field: str) -> dict:
    """The color encoding on `field` in a (layered) spec."""
    stack = [spec]
    while stack:
        node = stack.pop()
        colour = node.get("encoding", {}).get("color", {})
        if colour.get("field") == field:
            return colour
        stack += node.get("layer", [])
    raise AssertionError(f"no colour on {field}")


def test_both_attribution_charts_share_one_diverging_scale_centred_at_zero_with_a_legend(app):  # noqa: F811
    open_page(app, "lens")
    [bars], [cells] = specs_titled(app, "per component"), specs_titled(app, "direct attribution per head")
    scales = [colour_of(spec, "attribution") for spec in (bars, cells)]
    for colour in scales:
        scale = colour["scale"]
        assert scale.get("scheme") == "redblue" and not scale.get("reverse"), scale  # negative red, positive blue
        assert scale.get("domainMid") == 0, scale
        assert colour.get("legend") is not None, colour
    assert scales[0]["scale"] == scales[1]["scale"]  # one scale: the same value, the same colour


def test_a_link_to_a_step_opens_the_snapshot_nearest_it_and_says_which(runs, monkeypatch):  # noqa: F811
    app = fresh_app(runs, monkeypatch, run="a_rms")  # snapshots at steps 0, 10 and 20
    app.query_params["step"] = "12"  # the doctor's "see it on Attention at step 12"
    app.switch_page("views/attention.py").run()
    assert not app.exception, [e.value for e in app.exception]
    slider = next(s for s in app.sidebar.select_slider if s.label == "snapshot")
    assert slider.value == "step_000010"
    notice = next(i.value for i in app.info if "step 12" in i.value)
    assert "step_000010" in notice and "nearest" in notice
    slider.set_value("step_000020").run()  # the user moves on: the link no longer holds the slider
    assert next(s for s in app.sidebar.select_slider if s.label == "snapshot").value == "step_000020"
    assert not any("step 12" in i.value for i in app.info)


def text_colour(spec: dict) -> dict:
    """The color encoding of the text layer of a (layered) spec."""
    layer = next(l for l in spec["layer"] if (l.get("mark") or {}).get("type", l.get("mark")) == "text")
    return layer["mark"], layer["encoding"]["color"]


def test_cell_labels_are_white_on_dark_cells_and_the_lens_letters_are_large_enough(app):  # noqa: F811
    open_page(app, "lens")
    for title, value, dark_at in [("top-1 token per layer", "top-1 probability", lambda v, m: v > 0.6),
                                  ("direct attribution per head", "attribution", lambda v, m: abs(v) > 0.6 * m)]:
        i = next(i for i in range(len(app.get("vega_lite_chart"))) if title in json.dumps(chart_data(app, i)[1]))
        frames, spec = chart_data(app, i)
        mark, colour = text_colour(spec)
        assert colour["condition"]["value"] == "white" and colour["value"] == "black", colour
        cells = frames[0]
        biggest = colour_of(spec, value)["scale"].get("domain", [0, 1])[1]  # attribution: +-the largest |value|
        assert list(cells["dark"]) == [dark_at(v, biggest) for v in cells[value]], title
        assert cells["dark"].any() or title.startswith("direct")  # the lens of a trained model has confident cells
        if value == "top-1 probability":
            assert mark["fontSize"] >= 12


def test_the_logit_and_the_tuned_lens_colour_ranks_on_one_scale(runs, monkeypatch, tmp_path):  # noqa: F811
    import shutil

    from probes import tuned_lens

    lensed = tmp_path / "runs"
    shutil.copytree(runs / "a_rms", lensed / "a_rms")
    assert tuned_lens.main(["--ckpt", str(lensed / "a_rms"), "--steps", "3", "--batch-size", "2",
                            "--samples", "2", "--no-progress", "--device", "cpu"]) == 0
    app = fresh_app(lensed, monkeypatch, run="a_rms")
    open_page(app, "lens")
    app.radio(key="lens_measure").set_value("rank of the true next token").run()
    grids = specs_titled(app, "top-1 token per layer and position")
    assert len(grids) == 2 and "tuned lens: top-1" in json.dumps(grids[1])
    scales = [colour_of(spec, "rank of the true next token")["scale"] for spec in grids]
    assert scales[0] == scales[1] and scales[0]["domain"][0] == 0 and scales[0]["domain"][1] > 1, scales


def test_the_lens_kl_of_a_diverged_snapshot_has_a_finite_axis_and_lines_name_their_snapshots(monkeypatch):
    from pathlib import Path

    nan_run = Path(__file__).resolve().parent.parent / "checkpoints" / "transformer4_nan"
    app = fresh_app(nan_run.parent / "transformer4_nan", monkeypatch, run="transformer4_nan")
    open_page(app, "lens")
    [kl] = specs_titled(app, "KL to the final layer, per layer")
    frames = chart_data(app, next(i for i in range(len(app.get("vega_lite_chart")))
                                  if "KL to the final layer, per layer" in json.dumps(chart_data(app, i)[1])))[0]
    assert frames[0]["KL(final || layer)"].isna().all()  # the final layer is NaN: nothing to measure against
    assert set(frames[0]["run"]) == {"transformer4_nan / step_000005"}  # not "this"
    line = next(l for l in kl["layer"] if (l.get("mark") or {}).get("type") == "line")
    assert line["encoding"]["y"]["scale"]["domain"] == [0, 1]  # no "Infinite extent"
    open_page(app, "compare")
    [kl] = specs_titled(app, "logit-lens KL per layer")
    i = next(i for i in range(len(app.get("vega_lite_chart"))) if "logit-lens KL" in json.dumps(chart_data(app, i)[1]))
    assert set(chart_data(app, i)[0][0]["run"]) == {"A: transformer4_nan / step_000005",
                                                    "B: transformer4_nan / step_000000"}


def test_the_landing_view_leaves_health_to_the_doctor(monkeypatch):
    """attn1_noscale's files hold no NaN, but the doctor fails it: the state column said "healthy"
    beside "failed"; now it says what the files hold and the doctor alone judges."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    st.cache_data.clear()
    st.cache_resource.clear()
    monkeypatch.delenv("SCRATCHSCOPE_RUNS", raising=False)
    monkeypatch.delenv("SCRATCHSCOPE_NO_SHIPPED", raising=False)
    at = AppTest.from_file("../app/main.py", default_timeout=180)
    at.run()
    table = at.dataframe[0].value.set_index("run")
    assert table.loc["attn1_noscale", "doctor"] == "failed"
    words = {"healthy", "warning", "failed"}
    assert not words & set(table["state"]), table["state"].to_dict()  # health words are the doctor's column
    assert table.loc["transformer4_nan", "state"] == "diverged"
