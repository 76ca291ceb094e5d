"""The run doctor in the app (AppTest on the shipped runs): the Overview opens with the probe's
verdict and findings, the dynamics and loss charts draw one rule per finding step, a finding's
link preselects its step, and unusable metrics or a lone snapshot never crash the page."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from probes import diagnose

REPO = Path(__file__).resolve().parent.parent
APP = REPO / "app" / "main.py"
SHIPPED = REPO / "checkpoints"


@pytest.fixture
def start(monkeypatch):
    """start(run, roots=None, **query): the app opened on `run` (?run=), shipped runs listed unless
    `roots` replaces them."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    st.cache_data.clear()
    st.cache_resource.clear()  # caches outlive an AppTest

    def open_app(run: str, roots: list[Path] | None = None, **query: str):
        if roots is not None:
            monkeypatch.setenv("SCRATCHSCOPE_RUNS", ":".join(str(r) for r in roots))
            monkeypatch.setenv("SCRATCHSCOPE_NO_SHIPPED", "1")
        at = AppTest.from_file(str(APP), default_timeout=180)
        at.query_params.update({"run": run, **query})
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        return at
    return open_app


def finding_rules(chart) -> pd.DataFrame | None:
    """The rows of the chart's finding-rule layer (a rule mark coloured by severity), or None."""
    spec = json.loads(chart.proto.spec)
    datasets = {d.name: pa.ipc.open_stream(d.data.data).read_all().to_pandas() for d in chart.proto.datasets}
    layers = [spec]
    while layers:
        layer = layers.pop()
        layers += layer.get("layer", [])
        mark = layer.get("mark")
        kind = mark.get("type") if isinstance(mark, dict) else mark
        if kind == "rule" and layer.get("encoding", {}).get("color", {}).get("field") == "severity":
            return datasets[layer["data"]["name"]]
    return None


def stepped(run: str) -> list:
    return [f for f in diagnose.run(SHIPPED / run).findings if f.step is not None]


def test_a_diverged_run_opens_on_the_failed_verdict_and_its_findings(start):
    at = start("transformer4_nan")
    expected = diagnose.run(SHIPPED / "transformer4_nan")
    assert expected.verdict == "failed"
    assert any("Verdict: **failed**" in e.value for e in at.error)
    divergence = next(f for f in expected.findings if f.code == "divergence")
    labels = [e.label for e in at.expander]
    assert any(divergence.title in label and "`divergence` at step 5" in label for label in labels)
    shown = [label for label in labels if "-badge[" in label]
    assert len(shown) == len(expected.findings)  # every finding, in the probe's ranked order
    assert [label.split("`")[1] for label in shown] == [f.code for f in expected.findings]
    assert f"first warning** at step {divergence.warning_step}" in "\n".join(m.value for m in at.markdown)
    assert len(at.table) == sum(1 for f in expected.findings if f.evidence)
    links = [p.proto for p in at.get("page_link")]
    assert len(links) == len(expected.findings)
    assert sum(p.page == "dynamics" for p in links) == sum(f.page == "dynamics" for f in expected.findings)
    assert all(fix in "\n".join(m.value for m in at.markdown) for fix in expected.fixes())
    assert any(e.label.startswith("not checked") for e in at.expander) == bool(expected.not_checked)


def test_a_healthy_run_says_healthy_and_shows_no_error(start):
    at = start("shakespeare_rms4_adam")
    assert any("Verdict: **healthy**" in s.value for s in at.success)
    assert not at.error and not at.warning


def test_char_mlp_shows_its_sparse_layer_as_a_note_with_nothing_to_fix(start):
    at = start("char_mlp")
    sparse = next(e for e in at.expander if "`sparse_units`" in e.label)
    text = "\n".join(m.value for m in sparse.markdown)
    assert "**fix** none needed" in text and "Kaiming" not in text
    page = "\n".join(m.value for m in at.markdown)  # with or without a What to try section
    assert "Kaiming" not in page and "units alive" not in page
    assert not any("dead_units" in e.label for e in at.expander)


def test_the_loss_and_dynamics_charts_draw_one_rule_per_finding_step(start):
    findings = stepped("transformer4_nan")
    expected = sorted((f.step, f.code, f.severity) for f in findings)
    at = start("transformer4_nan")
    loss = finding_rules(at.get("vega_lite_chart")[0])
    assert loss is not None and len(loss) == len(findings)
    at.switch_page("views/dynamics.py").run()
    assert not at.exception, [e.value for e in at.exception]
    charts = at.get("vega_lite_chart")
    # entropy per head for 4 layers, the u medians, then the training signals it logged: learning
    # rate, gradient norm, step time, tokens per second, dead and saturated MLP shares, and the
    # doctor's internals: largest attention score, residual rms, largest |logit|
    assert len(charts) == 14
    for chart in charts:
        rules = finding_rules(chart)
        assert rules is not None, "a dynamics chart without finding rules"
        assert sorted(zip(rules["step"], rules["code"], rules["severity"])) == expected


def test_a_findings_link_preselects_its_step_once(start):
    at = start("transformer4_nan", step="3")
    at.switch_page("views/dynamics.py").run()
    assert at.select_slider(key="gwu_step").value == 3
    at.select_slider(key="gwu_step").set_value(1).run()
    assert at.select_slider(key="gwu_step").value == 1  # the user's choice is kept after the link


def test_unusable_metrics_are_an_error_line_and_the_page_goes_on(start, tmp_path):
    run = tmp_path / "garbled"
    run.mkdir()
    (run / "metrics.jsonl").write_text("this is not json\n{\"step\": \"three\"}\n")
    shutil.copytree(SHIPPED / "transformer4_nan" / "step_000000", run / "step_000000")
    at = start("garbled", roots=[run])
    errors = [e.value for e in at.error]
    assert any(e.startswith("The run doctor could not read this run:") and "no metrics.jsonl records" in e
               for e in errors), errors
    assert not at.success and not at.warning  # no verdict
    assert any(e.label == "model config" for e in at.expander)  # the rest of the Overview still renders
    at.switch_page("views/dynamics.py").run()
    assert not at.exception


def test_a_malformed_record_is_counted_on_the_overview_and_dynamics(start, tmp_path):
    run = tmp_path / "attn1_noscale"
    shutil.copytree(SHIPPED / "attn1_noscale", run)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    bad = json.dumps({"step": json.loads(lines[2])["step"] + 1, "attn_entropy": {"0": [1.0] * 9}})  # 1 head
    (run / "metrics.jsonl").write_text("\n".join(lines[:3] + [bad] + lines[3:]) + "\n")
    expected = diagnose.run(SHIPPED / "attn1_noscale")
    at = start("attn1_noscale", roots=[tmp_path])
    boxes = [b.value for b in [*at.success, *at.warning, *at.error] if "Verdict" in b.value]
    assert boxes and "; read from metrics.jsonl; 1 malformed record skipped)" in boxes[0]
    assert f"Verdict: **{expected.verdict}**" in boxes[0]  # the answer of the clean run
    skipped = f"; 1 malformed record of {run / 'metrics.jsonl'} skipped (line 4)"
    assert any(c.value == f"{len(lines)} records, steps 0..{json.loads(lines[-1])['step']}{skipped}: the app's "
               "log says what is wrong with each" for c in at.caption), [c.value for c in at.caption]
    at.switch_page("views/dynamics.py").run()
    assert not at.exception and any(skipped in c.value for c in at.caption)


def test_a_lone_snapshot_says_the_doctor_reads_a_run(start):
    snapshot = SHIPPED / "transformer4_nan" / "step_000000"
    at = start(snapshot.name, roots=[snapshot])
    assert any("reads a run directory" in i.value for i in at.info)
    assert not any("Verdict" in b.value for b in [*at.success, *at.warning, *at.error])


def test_with_findings_leaves_a_chart_without_findings_as_it_was():
    from app import charts

    base = charts.lines_over_steps(pd.DataFrame({"step": [0, 1], "v": [1.0, 2.0], "c": ["a", "a"]}), "v", "c", "t")
    empty = pd.DataFrame(columns=["step", "code", "severity", "title"])
    assert charts.with_findings(base, empty) is base
    marked = charts.with_findings(base, pd.DataFrame(
        [{"step": 1, "code": "x", "severity": "failed", "title": "t"}])).to_dict()
    rule = marked["layer"][-1]
    assert rule["mark"]["type"] == "rule"
    assert rule["encoding"]["color"]["scale"]["range"][2] == charts.SEVERITY_COLOURS["failed"]


def trainer_output(root: Path) -> Path:
    """A Trainer output directory whose log goes NaN at step 30 (trainer_state.json written by
    transformers' own TrainerState; no weights: the doctor needs none)."""
    transformers = pytest.importorskip("transformers")
    out = root / "hf-out"
    out.mkdir(parents=True)
    logs = [{"loss": 4.0 - s / 20 if s < 20 else 3.0 + (s - 20), "grad_norm": float("nan") if s >= 30 else 1.0 + s,
             "learning_rate": 1e-3, "step": s} for s in range(5, 41, 5)]
    transformers.TrainerState(max_steps=40, global_step=40, logging_steps=5, log_history=logs).save_to_json(
        str(out / "trainer_state.json"))
    return out


def test_a_trainer_output_dir_is_listed_and_diagnosed_on_the_overview(start, tmp_path):
    trainer_output(tmp_path)
    expected = diagnose.run(tmp_path / "hf-out")
    at = start("", roots=[tmp_path])  # the landing view: the folder's runs
    table = at.dataframe[0].value.set_index("run")
    assert table.loc["hf-out", "doctor"] == expected.verdict == "failed"
    assert table.loc["hf-out", "steps"] == 40 and "trainer_state.json" in table.loc["hf-out", "state"]
    at = start("hf-out", roots=[tmp_path])
    verdicts = [e.value for e in at.error if e.value.startswith("Verdict")]
    assert verdicts and "read from trainer_state.json" in verdicts[0]
    divergence = next(f for f in expected.findings if f.code == "divergence")
    assert any(f"`divergence` at step {divergence.step}" in e.label for e in at.expander)
    # what it did not log, and how: for a Trainer's log, the Trainer callback (issue 36, item 9)
    assert any("train.monitor.HFCallback" in m.value for m in at.markdown)
