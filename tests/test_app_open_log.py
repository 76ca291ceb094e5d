"""'Open a path' opens what the run doctor reads (issue 38, item 6): a printed training log typed by
itself (docs/nanogpt_diverged.log, which `python -m probes.diagnose --log` reads) or a folder of such
logs (docs/) is listed, and its Overview shows the doctor's diagnosis of it and the loss curves the
doctor read from it, instead of "... or a training log: nothing to open"."""

from __future__ import annotations

import math
from pathlib import Path

from app_kit import open_app
from chart_kit import frames
from probes import diagnose

REPO = Path(__file__).resolve().parent.parent
LOG = REPO / "docs" / "nanogpt_diverged.log"


def typed(at, text: str):
    at.sidebar.text_input(key="typed_path").set_value(text).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def loss_points(at) -> dict[tuple[str, int], float]:
    """(curve, step) -> loss of the Overview's loss chart (the charts whose data has a loss column)."""
    points = {}
    for chart in at.get("vega_lite_chart"):
        for frame in frames(chart):
            if {"loss", "curve", "step"} <= set(frame.columns):
                points.update({(c, int(s)): v for c, s, v in zip(frame["curve"], frame["step"], frame["loss"])})
    return points


def test_a_typed_nanogpt_log_opens_on_its_diagnosis_and_loss_curves(monkeypatch, tmp_path):
    expected = diagnose.run(LOG)
    at = typed(open_app(monkeypatch, roots=[tmp_path]), str(LOG))
    assert not at.sidebar.error, [e.value for e in at.sidebar.error]
    assert at.sidebar.selectbox(key="run").value == LOG.name
    at.switch_page("views/overview.py").run()
    assert not at.exception, [e.value for e in at.exception]
    verdicts = [e.value for e in at.error if e.value.startswith("Verdict")]
    assert verdicts and f"**{expected.verdict}**" in verdicts[0] and expected.source in verdicts[0]
    divergence = next(f for f in expected.findings if f.code == "divergence")
    assert any(f"`divergence` at step {divergence.step}" in e.label for e in at.expander)
    # the curves are the records the doctor read from the log, step for step
    from probes.doctor.run_history import RunHistory

    records = RunHistory.read(LOG).records
    drawn = loss_points(at)
    finite = [(r["step"], r["train_loss"]) for r in records if math.isfinite(r.get("train_loss", math.nan))]
    assert finite and all(math.isclose(drawn[("train loss", s)], v, rel_tol=1e-6) for s, v in finite)
    assert any(key[0] == "val loss" for key in drawn)
    # a log has no weights: the page says so in its words, and no model is loaded
    assert any("training log" in i.value for i in at.info)


def test_a_typed_folder_of_logs_lists_each_log_with_the_doctors_verdict(monkeypatch, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "run_a.log").write_text(LOG.read_text())
    # a nanoGPT-style printed log written here: loss falls steadily over 300 iterations
    (logs / "run_b.out").write_text("".join(f"iter {i}: loss {4.0 - i / 100:.4f}, time 10.00ms, mfu 1.00%\n"
                                            for i in range(0, 300, 10)))
    (logs / "notes.md").write_text("not a log\n")
    at = typed(open_app(monkeypatch, roots=[tmp_path / "none"]), str(logs))
    assert not at.sidebar.error, [e.value for e in at.sidebar.error]
    assert at.sidebar.selectbox(key="run").options == ["run_a.log", "run_b.out"]
    at.query_params.clear()
    at.switch_page("views/home.py").run()
    table = at.dataframe[0].value.set_index("run")
    for name in ("run_a.log", "run_b.out"):
        expected = diagnose.run(logs / name)
        assert table.loc[name, "doctor"] == expected.verdict
        assert table.loc[name, "steps"] == expected.last_step
        assert expected.source in table.loc[name, "state"]
    assert table.loc["run_a.log", "doctor"] == "failed" and table.loc["run_b.out", "doctor"] != "failed"


def test_the_docs_folder_opens_its_log_and_other_files_are_still_refused(monkeypatch, tmp_path):
    at = typed(open_app(monkeypatch, roots=[tmp_path]), str(LOG.parent))
    assert not at.sidebar.error and at.sidebar.selectbox(key="run").options == [LOG.name]
    typed(at, str(REPO / "README.md"))
    assert any("is not a run, a snapshot" in e.value for e in at.sidebar.error)
