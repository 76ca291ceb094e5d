"""The run doctor in the app: the Overview's diagnosis section, and the finding steps the charts mark.

Every word and number comes from `probes.diagnose` (cached in `app.run_files.diagnosis`); this module
only lays them out and links each finding to the page that shows its evidence.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Callable

import pandas as pd
import streamlit as st

from app import logs, run_files
from app.views.common import PAGES, Selection, first_line
from probes.doctor.finding import SEVERITIES, Finding

TITLES = dict(PAGES)
BADGES = {"info": "blue", "warning": "orange", "failed": "red"}  # markdown badge colours
MARK_COLUMNS = ["step", "code", "severity", "title"]


def section(sel: Selection, between: Callable[[], None] | None = None) -> None:
    """The diagnosis of the selected run: its verdict, then `between` (the Overview's loss chart,
    so that it is in the first screen), then the findings (one line each, the first failure open),
    what to try and what was not checked."""
    between = between or (lambda: None)
    st.subheader("Run doctor")
    if not diagnosable(sel.run):
        what = "This run has no metrics.jsonl" if sel.run.is_run else "This is a lone snapshot"
        st.info(f"{what}: the run doctor reads a run directory (its metrics.jsonl, from `python -m train` "
                "or `train.monitor.Monitor`), a Trainer's trainer_state.json, TensorBoard event files, or "
                "nanoGPT's printed *.log beside its ckpt.pt.")
        between()
        return
    try:
        diagnosis = run_files.diagnosis(sel.run.path)
    except Exception as exc:  # noqa: BLE001 - unusable metrics: one line here, the page goes on
        st.error(f"The run doctor could not read this run: {first_line(exc)}")
        if logs.foreign_log(sel.run.path) is None:  # another trainer's log: its curves come from the same read
            between()
        return
    verdict(diagnosis)
    between()
    opened = first_to_open(diagnosis.findings)
    for finding in diagnosis.findings:
        show_finding(finding, sel.run.label, expanded=finding is opened)
    fixes = diagnosis.fixes()
    if fixes:
        st.markdown("**What to try**" + ("" if diagnosis.above_info() else " (optional: nothing above info)"))
        st.markdown("\n".join(f"- {fix}" for fix in fixes))
    if diagnosis.not_checked:
        with st.expander(f"not checked ({len(diagnosis.not_checked)} rules)", expanded=False):
            st.markdown("\n".join(f"- `{code}`: {why}" for code, why in diagnosis.not_checked.items()))


def diagnosable(run: Any) -> bool:
    """A run of ours with its metrics.jsonl, or a folder holding another trainer's log."""
    return (run.is_run and (run.path / "metrics.jsonl").is_file()) or logs.foreign_log(run.path) is not None


def verdict(diagnosis: Any) -> None:
    counts = Counter(f.severity for f in diagnosis.findings)
    found = ", ".join(f"{counts[s]} {s}" for s in reversed(SEVERITIES) if counts[s]) or "no findings"
    span = f"steps {diagnosis.first_step}..{diagnosis.last_step}; read from {diagnosis.source}{diagnosis.skipped_text()}"
    box = {"healthy": st.success, "warning": st.warning, "failed": st.error, "too short": st.info}[diagnosis.verdict]
    box(f"Verdict: **{diagnosis.verdict}** ({found}; {span})")
    if diagnosis.guard:
        st.caption(diagnosis.guard_text().capitalize())


def first_to_open(findings: list[Finding]) -> Finding | None:
    """The one finding shown open: the first failure, else the first warning; the others are one
    line each, so that the loss chart below stays in the first screen (8 open findings made the
    Overview of a diverged run 6,000 px tall)."""
    for severity in ("failed", "warning"):
        found = next((f for f in findings if f.severity == severity), None)
        if found is not None:
            return found
    return None


def show_finding(f: Finding, run_label: str, expanded: bool = False) -> None:
    when = "" if f.step is None else f" at step {f.step}"
    label = f":{BADGES[f.severity]}-badge[{f.severity}] `{f.code}`{when}: {f.title}"
    with st.expander(label, expanded=expanded):
        text, numbers = st.columns([3, 2])
        lines = [f"**starts** at step {f.step}" if f.step is not None else "**starts** -"]
        if f.severity == "failed" and f.warning_step not in (None, f.step):
            lines[0] += f"; **first warning** at step {f.warning_step}"
        if f.where:
            lines.append("**where** " + ", ".join(f.where))
        lines += [f"**cause** {f.cause}", f"**fix** {f.fix or 'none needed: a note, not a fault'}",
                  f"**reference** {f.reference}"]
        text.markdown("\n\n".join(lines))
        link(f, run_label, text)
        if f.evidence:
            numbers.table(pd.DataFrame({"evidence": list(f.evidence),
                                        "value": [shown(v) for v in f.evidence.values()]}).set_index("evidence"))


def link(f: Finding, run_label: str, where: Any) -> None:
    """A link to the page (and step) that shows the finding's evidence."""
    if f.page not in TITLES:
        return
    params = {"run": run_label} if f.step is None else {"run": run_label, "step": str(f.step)}
    where.page_link(f"views/{f.page}.py", icon=":material/arrow_forward:", query_params=params,
                    label=f"see it on {TITLES[f.page]}" + ("" if f.step is None else f" at step {f.step}"))


def shown(value: Any) -> str:
    """An evidence value as table text (the numbers as the doctor logged them, rounded to show)."""
    if isinstance(value, float):
        return "nan" if not math.isfinite(value) else f"{value:.3g}" if abs(value) >= 1e-3 or value == 0 \
            else f"{value:.2e}"
    if isinstance(value, (list, tuple)):
        return ", ".join(shown(v) for v in value)
    return str(value)


def marks(run: Any) -> pd.DataFrame:
    """The run's findings that start at a step, as rows {step, code, severity, title} for
    `charts.with_findings`; empty for a lone snapshot or a run the doctor cannot read (the
    Overview says why)."""
    rows: list[dict[str, Any]] = []
    if diagnosable(run):
        try:
            rows = [{"step": f.step, "code": f.code, "severity": f.severity, "title": f.title}
                    for f in run_files.diagnosis(run.path).findings if f.step is not None]
        except Exception:  # noqa: BLE001 - the charts still draw, without marks
            rows = []
    return pd.DataFrame(rows, columns=MARK_COLUMNS)
