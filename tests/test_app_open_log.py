"""'Open a path' opens what the run doctor reads (issue 38, item 6): a printed training log typed by
itself (docs/nanogpt_diverged.log, which `python -m probes.diagnose --log` reads) or a folder of such
logs (docs/) is listed, and its Overview shows the doctor's diagnosis of it and the loss curves the
doctor read from it, instead of "... or a training log: nothing to open".

Issue 44: a log the doctor cannot read (random bytes, an empty log, a Git LFS pointer) is refused in
the sidebar in one line, where it was selected and its Overview showed a traceback; llm.c's `-o`
folder opens on its verdict and curves with no "expected a snapshot directory" box."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
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


def llmc_folder(folder: Path) -> Path:
    """llm.c's `-o` output folder: its logger's main.log (loss falling over 60 steps, an eval every
    20) beside the weights and state in llm.c's own binary format, which scratchscope does not read."""
    folder.mkdir()
    lines = []
    for step in range(60):
        lines.append(f"s:{step} trl:{4.0 - step / 30:.4f} lr:0.000300 norm:1.20\n")
        if step % 20 == 0:
            lines.append(f"s:{step} tel:{4.1 - step / 30:.4f}\n")
    (folder / "main.log").write_text("".join(lines))
    (folder / "model_00000060.bin").write_bytes(bytes(range(256)) * 8)
    (folder / "state_00000060_00000.bin").write_bytes(bytes(512))
    (folder / "DONE_00000060").write_text("")
    return folder


def test_a_log_the_doctor_cannot_read_is_refused_in_the_sidebar_in_one_line(monkeypatch, tmp_path):
    import random

    (tmp_path / "random.log").write_bytes(random.Random(0).randbytes(4000))
    (tmp_path / "empty.log").write_text("")
    (tmp_path / "lfs").mkdir()  # a clone without `git lfs pull`: the pointer stands where main.log should be
    (tmp_path / "lfs" / "main.log").write_text("version https://git-lfs.github.com/spec/v1\n"
                                               f"oid sha256:{'ab' * 32}\nsize 48213\n")
    at = open_app(monkeypatch, roots=[tmp_path / "none"])
    for typed_path, named in (("random.log", "random.log"), ("empty.log", "empty.log"),
                              ("lfs", "main.log: a Git LFS pointer")):
        errors = [e.value for e in typed(at, str(tmp_path / typed_path)).sidebar.error]
        said = [e for e in errors if str(tmp_path) in e]
        assert len(said) == 1 and "\n" not in said[0] and named in said[0], errors
        assert "run" not in [w.key for w in at.sidebar.selectbox]  # nothing was opened
    at.switch_page("views/overview.py").run()
    assert not at.exception and not at.main.error


def test_an_llmc_output_folder_opens_on_its_verdict_and_curves_with_no_error(monkeypatch, tmp_path):
    folder = llmc_folder(tmp_path / "gpt2_124M")
    expected = diagnose.run(folder)
    at = typed(open_app(monkeypatch, roots=[tmp_path / "none"]), str(folder))
    assert not at.sidebar.error and at.sidebar.selectbox(key="run").value == folder.name
    at.switch_page("views/overview.py").run()
    assert not at.exception
    verdicts = [box.value for kind in ("success", "warning", "error", "info") for box in getattr(at, kind)
                if box.value.startswith("Verdict")]
    assert verdicts and f"**{expected.verdict}**" in verdicts[0]
    assert not [e.value for e in at.error if not e.value.startswith("Verdict")]  # no "expected a snapshot"
    assert any("main.log" in i.value and "no checkpoint" in i.value for i in at.info)
    drawn = loss_points(at)
    assert drawn[("train loss", 59)] == pytest.approx(float(f"{4.0 - 59 / 30:.4f}"), rel=1e-9) and ("val loss", 40) in drawn
    for name in ("attention", "dynamics"):  # pages that read weights or our run's signals say so, once
        at.switch_page(f"views/{name}.py").run()
        assert not at.exception and not at.error and len(at.info) == 1, [i.value for i in at.info]


def test_a_listed_folder_whose_log_is_unreadable_says_so_in_one_line_on_its_overview(monkeypatch, tmp_path):
    (tmp_path / "lfs").mkdir()
    (tmp_path / "lfs" / "main.log").write_text("version https://git-lfs.github.com/spec/v1\n"
                                               f"oid sha256:{'cd' * 32}\nsize 99\n")
    at = open_app(monkeypatch, roots=[tmp_path], page="overview", run="lfs")
    assert not at.exception
    assert [e.value for e in at.error] == [f"The run doctor could not read this run: {tmp_path / 'lfs' / 'main.log'}: "
                                           "a Git LFS pointer, not the file: run git lfs pull"]


def test_a_typed_wandb_file_opens_as_its_run_folder_does(monkeypatch, tmp_path):
    """A bare run-<id>.wandb (copied out of its folder, or typed by its name) is a log the doctor reads:
    the sidebar opens it on the same verdict as its folder, where it was refused."""
    from wandb_kit import offline_wandb, write_run

    with offline_wandb(tmp_path / "w") as wandb:
        folder = write_run(wandb, [{"train/loss": 4.2 - 0.01 * i, "iter": i, **({"val/bpb": 2.0 - i / 1000}
                                     if i % 50 == 0 else {})} for i in range(0, 300, 10)])
    bare = next(folder.glob("run-*.wandb"))
    at = typed(open_app(monkeypatch, roots=[tmp_path / "none"]), str(bare))
    assert not at.sidebar.error, [e.value for e in at.sidebar.error]
    assert at.sidebar.selectbox(key="run").value == bare.name
    at.switch_page("views/overview.py").run()
    assert not at.exception, [e.value for e in at.exception]
    expected = diagnose.run(folder)
    assert diagnose.run(bare).verdict == expected.verdict
    assert any(f"**{expected.verdict}**" in m.value for m in at.get("markdown") + list(at.error) + list(at.success)
               + list(at.warning) if m.value.startswith("Verdict"))
    # nanochat's val/bpb (bits per byte) has the BPC chart's place, step for step
    drawn = {int(s): v for chart in at.get("vega_lite_chart") for frame in frames(chart) if "BPB" in frame.columns
             for s, v in zip(frame["step"], frame["BPB"])}
    assert drawn and all(math.isclose(drawn[s], 2.0 - s / 1000, rel_tol=1e-6) for s in range(0, 300, 50))
