"""The run doctor's core: every rule run over one RunHistory, the findings ranked into a
Diagnosis (verdict, findings, what could not be checked). `probes.diagnose` is its CLI.

Each rule (`probes.doctor.rules_loss`, `probes.doctor.rules_internals`) turns one of the series'
diagnoses into a `Finding` with its evidence, cause, fix and reference; its thresholds live in
`probes.doctor.thresholds.DoctorThresholds`. A rule whose input was not logged says so in
`not_checked` instead of guessing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from probes.doctor import (flags, rescues, rules_development, rules_growth, rules_internals, rules_level, rules_loss,
                           rules_progress, rules_updates)
from probes.doctor.finding import SEVERITIES, Finding, NotChecked, rank_key
from probes.doctor.read_wandb import SOURCE as WANDB_SOURCE
from probes.doctor.run_history import RunHistory
from probes.doctor.thresholds import DoctorThresholds

__all__ = ["Diagnosis", "Finding", "RULES", "TOO_SHORT", "VERDICTS", "diagnose_history", "run"]

VERDICTS = {"info": "healthy", "warning": "warning", "failed": "failed"}
TOO_SHORT = "too short"  # the verdict of a run with too few logged losses and nothing above info
RULES = (rules_loss.divergence, rules_internals.attention, rules_internals.attn_logit_growth,
         rules_internals.output_logit_growth, rules_loss.init_loss, rules_updates.update_ratios,
         rules_internals.activations, rules_progress.overfitting, rules_progress.plateau, rules_loss.grad_spike,
         rules_level.skipped, rules_level.uniform_loss, *rules_growth.RULES, rescues.rescues,
         rules_development.head_phases)


@dataclass
class Diagnosis:
    """The doctor's report on one run: a verdict, ranked findings, and what it could not check."""

    run: str
    verdict: str
    findings: list[Finding]
    first_step: int
    last_step: int
    upto: int | None = None
    not_checked: dict[str, str] = field(default_factory=dict)  # code -> why
    source: str = "metrics.jsonl"  # what the history was read from (RunHistory.source)
    skipped_records: int = 0  # malformed records left out of the history (each warned about)
    points: int = 0  # records that logged a loss
    trainer: str = flags.OURS  # whose words the advice uses (probes.doctor.flags)
    learned: str = ""  # with fewer points than the rules need: what says the run learns ("the val loss fell 59x ...")
    guard: dict[str, Any] = field(default_factory=dict)  # run.json's guard settings: a guarded run, acted or not

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "source": self.source, "verdict": self.verdict, "first_step": self.first_step,
                "last_step": self.last_step, "upto": self.upto, "skipped_records": self.skipped_records,
                "points": self.points, **({"learned": self.learned} if self.learned else {}),
                **({"guard": self.guard} if self.guard else {}),
                "findings": [f.to_dict() for f in self.findings], "not_checked": self.not_checked}

    def skipped_text(self) -> str:
        """'; 2 malformed records skipped' ('lines' of a printed log; the warnings name them), or nothing."""
        n = self.skipped_records
        printed = self.trainer in ("nanogpt", "llmc") and self.source != "metrics.jsonl" \
            and not self.source.startswith(WANDB_SOURCE)  # nanoGPT's W&B run: records
        what = "line" if printed else "record"
        return f"; {n} malformed {what}{'s' if n > 1 else ''} skipped" if n else ""

    def guard_text(self) -> str:
        """'guarded (act): a snapshot every 10 steps, 4 kept, ...', or '' for an unguarded run."""
        g = self.guard
        if not g:
            return ""
        return (f"guarded ({g.get('mode', '?')}): a snapshot every {g.get('every', '?')} steps, {g.get('keep', '?')} "
                f"kept, the rate cut to {g.get('cut', '?')}x where the run gives no better evidence, at most "
                f"{g.get('max_rescues', '?')} rescues (docs/guard.md)")

    def above_info(self) -> list[Finding]:
        return [f for f in self.findings if f.severity != "info"]

    def fixes(self) -> list[str]:
        """What to try, most urgent first, each fix once (info findings' fixes when nothing else);
        a finding with no fix (a note such as `sparse_units`) adds nothing."""
        return list(self.fixes_with_sources())

    def fixes_with_sources(self) -> dict[str, list[Finding]]:
        chosen = self.above_info() or self.findings
        out: dict[str, list[Finding]] = {}
        for f in chosen:
            if f.fix:
                out.setdefault(f.fix, []).append(f)
        return out

    def format(self) -> str:
        """A short ranked list (headline, evidence, cause), then what to try with its sources."""
        span = f"steps {self.first_step}-{self.last_step}" + (f", cut at --step {self.upto}" if self.upto is not None else "")
        lines = [f"{self.run} ({span}; read from {self.source}{self.skipped_text()}): {self.verdict.upper()}"]
        if self.guard:
            lines.append(f"  {self.guard_text()}")
        if self.verdict == TOO_SHORT:
            lines.append(f"  too short to judge: {self.points} logged loss{'es' if self.points != 1 else ''} "
                         "(the rules below need more)")
        elif self.learned and not self.above_info():
            lines.append(f"  {self.points} logged loss{'es' if self.points != 1 else ''}, few, but {self.learned}: "
                         "it learns")
        elif not self.findings:
            lines.append("  no findings: every rule that could look found the run healthy")
        for i, f in enumerate(self.findings, 1):
            when = f"step {f.step}" if f.step is not None else "-"
            if f.warning_step is not None and f.severity == "failed" and f.warning_step != f.step:
                when += f" (first warning at step {f.warning_step})"
            lines += [f"{i:>3}. [{f.severity}] {f.code} at {when}: {f.title}",
                      f"       evidence: {f.evidence_text()}", f"       why: {f.cause}"]
        fixes = self.fixes_with_sources()
        if fixes:
            lines.append("what to try:" if self.above_info() else "what to try (optional: nothing above info):")
            for fix, sources in fixes.items():
                refs = "; ".join(dict.fromkeys(short_reference(f.reference) for f in sources))
                lines.append(f"  - {fix} [{', '.join(dict.fromkeys(f.code for f in sources))}; {refs}]")
        if self.not_checked:
            lines.append("not checked:")
            lines += not_checked_lines(self.not_checked, self.trainer)
        return "\n".join(lines)


def not_checked_lines(not_checked: dict[str, str], trainer: str = flags.OURS) -> list[str]:
    """One line per reason with the codes it stops; the Monitor hint of a foreign log said once,
    in its trainer's words (a callback for a Trainer, three lines for nanoGPT, ...)."""
    codes_by_reason: dict[str, list[str]] = {}
    for code, why in not_checked.items():
        codes_by_reason.setdefault(why, []).append(code)
    hint = "; " + flags.monitor_hint(trainer)
    lines = [f"  - {', '.join(codes)}: {why.removesuffix(hint)}" for why, codes in codes_by_reason.items()]
    if any(why.endswith(hint) for why in codes_by_reason):
        lines.append(f"  (to check these too, {flags.monitor_hint(trainer)})")
    return lines


def short_reference(reference: str) -> str:
    """'Zhai et al. 2023, Stabilizing ...' -> 'Zhai et al. 2023'; 'the series, X: ...' -> 'the series, X'."""
    return "; ".join(part.split(",")[0] if " et al. " in part else part.split(":")[0]
                     for part in reference.split("; "))


def diagnose_history(history: RunHistory, thresholds: DoctorThresholds | None = None) -> Diagnosis:
    """Run every rule on a RunHistory; rank the findings (severity, then step)."""
    t = thresholds or DoctorThresholds()
    findings: list[Finding] = []
    not_checked: dict[str, str] = {}
    for check in RULES:
        try:
            findings += check(history, t)
        except NotChecked as why:
            not_checked.update({code: str(why) for code in check.codes})
    findings.sort(key=rank_key)
    worst = max((SEVERITIES.index(f.severity) for f in findings), default=0)
    points = sum(1 for r in history.records if "train_loss" in r or "val_loss" in r)
    # few points are too short to judge unless what they say is plain: a loss that fell tenfold
    fell = rules_level.learned(history, t) if points < t.min_points else ""
    verdict = TOO_SHORT if worst == 0 and points < t.min_points and not fell else VERDICTS[SEVERITIES[worst]]
    return Diagnosis(str(history.path), verdict, findings, history.first_step, history.last_step, history.upto,
                     not_checked, history.source, history.skipped, points, history.trainer, learned=fell,
                     guard=guard if isinstance(guard := history.info.get("guard"), dict) else {})


def run(run_dir: str | Path | None, step: int | None = None, thresholds: DoctorThresholds | None = None,
        *, log: str | Path | None = None, tags: Iterable[str] | dict[str, str] | None = None) -> Diagnosis:
    """Diagnose a run directory (or a snapshot inside one: the run up to that snapshot), another
    trainer's output (a Trainer output directory, TensorBoard events, a nanoGPT ckpt.pt with its
    *.log) or the log file `log`, up to `step` when given, as if it had stopped there. `tags` map a
    TensorBoard log's or trainer_state.json's own names to ours ({"Loss/train": "train_loss"})."""
    return diagnose_history(RunHistory.read(run_dir, upto=step, log=log, tags=tags), thresholds)
