"""The smaller points of the app's review (issue 29, item 12), in AppTest on the runs
tests/test_app.py trains (a 4-block transformer, a char MLP, and a transformer whose last snapshot
is truncated): samples wrap and their prompt shows its new lines, Compare's learning rate is on a
log axis, snapshot B opens on the second overlaid run, the B - A grid prints its numbers, the
per-layer entropy axes start at 0 unless zoomed, the g/w/u table has no empty rows and says what
its columns mean, the lens's layer names are explained, and an error box leads with its message."""

from __future__ import annotations

import json
import re

from chart_kit import frames, specs
from test_app import app, fresh_app, open_page, runs  # noqa: F401  (fixtures and helpers)


def test_the_prompt_shows_its_new_line_and_the_samples_wrap(runs, monkeypatch):  # noqa: F811
    app = fresh_app(runs, monkeypatch, run="b_mlp")
    n_ctx = json.loads((runs / "b_mlp" / "run.json").read_text())["model"]["n_ctx"]
    prompt = app.sidebar.text_area(key="text").value[:n_ctx]  # an MLP's prompt fills its window
    assert "\n" in prompt  # the premise: "ROMEO:\nBut" read "ROMEO:But"
    box = app.text_input(key="prompt:mlp")
    assert box.value == prompt.replace("\n", "⏎")
    samples = [c for c in app.code if c.value.startswith(prompt)]  # the model saw the real new line
    assert len(samples) == 2, [c.value[:20] for c in app.code]
    assert all(c.proto.wrap_lines for c in samples)


def test_compare_opens_b_on_the_second_run_prints_b_minus_a_and_words_its_errors(runs, monkeypatch):  # noqa: F811
    app = fresh_app(runs, monkeypatch, run="a_rms")
    open_page(app, "compare")
    overlaid = app.multiselect(key="overlay_runs:a_rms").value
    assert overlaid[0] == "a_rms" and len(overlaid) == 2
    latest = sorted(p.name for p in (runs / overlaid[1]).iterdir() if p.name.startswith("step_"))[-1]
    assert app.selectbox(key="cmp_b").value == f"{overlaid[1]} / {latest}"  # not a_rms's step 0
    [(lr, _)] = specs(app, "learning rate (as scheduled)")
    assert {y["scale"].get("type") for y in [lr["layer"][0]["encoding"]["y"]]} == {"log"}
    if overlaid[1] == "c_broken":  # its last snapshot is truncated: the box says so in our words
        said = [e.value for e in app.error if "truncated or corrupt" in e.value]
        assert said and not any(re.match(r"[A-Za-z_.]+(Error|Exception):", s) for s in said), said
    app.selectbox(key="cmp_b").set_value("a_rms / step_000000").run()
    grids = [f[0] for c in app.get("vega_lite_chart") for f in [frames(c)] if "verdict" in f[0].columns]
    [(_, [diff])] = specs(app, "B - A: normalised entropy (red: B more focused)")
    a, b = (g.set_index(["layer", "head"])["normalised entropy"] for g in grids)
    for row in diff.itertuples():
        assert row.text == f"{b[(row.layer, row.head)] - a[(row.layer, row.head)]:+.2f}"
    [(kl, _)] = specs(app, "logit-lens KL per layer")
    line = kl["layer"][0] if "layer" in kl else kl  # layered where a value is NaN
    assert "N_post: after block N" in line["encoding"]["x"]["title"]


def test_entropy_axes_start_at_zero_unless_zoomed(app):  # noqa: F811
    open_page(app, "dynamics")

    def zero() -> set:
        return {specs(app, f"layer {l}")[0][0]["layer"][0]["layer"][0]["encoding"]["y"]["scale"].get("zero")
                for l in range(4)}
    assert zero() == {True}
    app.toggle(key="entropy_zoom").set_value(True).run()
    assert zero() == {False}


def test_the_gwu_table_of_a_small_model_has_no_empty_rows_and_a_glossary(app, monkeypatch):  # noqa: F811
    import streamlit as st

    drawn, table = [], st.dataframe  # AppTest keeps no table's height: ask st.dataframe what it was given

    def spy(frame, *args, **kwargs):
        data = getattr(frame, "data", frame)  # a Styler's frame
        if "u_nominal" in getattr(data, "columns", ()):
            drawn.append((len(data), kwargs.get("height")))
        return table(frame, *args, **kwargs)
    monkeypatch.setattr(st, "dataframe", spy)
    open_page(app, "dynamics", run="b_mlp")
    rows, height = drawn[-1]
    assert rows == len(app.dataframe[0].value) < 10  # the char MLP's few parameters
    assert 0 < height <= (rows + 1) * 35 + 3, (rows, height)  # 35 px a row (and the header): none empty
    assert any("u_nominal = lr · g / w" in c.value for c in app.caption)
    assert any("'post_1' the second hidden layer" in c.value for c in app.caption)
