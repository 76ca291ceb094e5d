"""The run doctor during training: `--diagnose-every N` reads the run so far every N steps, and at
each record that brings an eval step's readings (what most rules judge), and prints each new finding
once, at the step its evidence arrived; a failing signal (a non-finite loss, a loss blown up a nat above its
best) is diagnosed at the record that shows it, off the cadence, and its divergence printed then;
when training stops (finished, interrupted or diverged) the whole diagnosis is printed. The
findings come from `probes.diagnose`, on what training just logged."""

from __future__ import annotations

import logging
import sys
import math
from pathlib import Path
from typing import Any

from probes import diagnose
from probes.doctor.finding import Finding
from probes.doctor.log_file import MAX_CROSS_ENTROPY
from probes.doctor.thresholds import DoctorThresholds

log = logging.getLogger("train")

__all__ = ["EVIDENCE", "LiveDoctor", "show_doctor_lines"]

# what an eval step logs besides the loss (train.records, the Monitor's readings): new evidence for the rules
EVIDENCE = ("val_loss", "attn_entropy", "attn_logit_max", "resid_rms", "logit_max", "activations")


def finding_line(f: Finding) -> str:
    return f"doctor: [{f.severity}] {f.code} at step {f.step}: {f.title}" + (f"; try: {f.fix}" if f.fix else "")


class LiveDoctor:
    """Diagnoses one run directory as it grows; remembers what it already said."""

    def __init__(self, run_dir: Path, every: int = 0):
        self.run_dir = Path(run_dir)
        self.every = every
        self.said: set[str] = set()  # codes printed: a finding whose parameters or step move as the
        # run grows is the same finding (update_ratio_high was printed twice, for other groups)
        self.first: dict[str, float] = {}  # each loss's first finite value, and its best so far
        self.best: dict[str, float] = {}

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    def alarm(self, record: dict[str, Any]) -> bool:
        """Whether a record about to be written shows a failing signal the doctor has not said yet:
        a non-finite loss (or the record's `diverged`), or a loss a nat above its best so far (half
        its first value for a loss far above any cross-entropy), as the divergence rule reads them."""
        if not self.every or "divergence" in self.said:
            return False
        if record.get("diverged"):
            return True
        t = DoctorThresholds()
        for key in ("train_loss", "val_loss"):
            value = record.get(key)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            if not math.isfinite(value):
                return True
            if key in self.best:
                first = self.first[key]
                rise = t.loss_rise if abs(first) <= MAX_CROSS_ENTROPY else t.rise_fraction * abs(first)
                if value > self.best[key] + rise:
                    return True
        return False

    def evidence(self, record: dict[str, Any]) -> bool:
        """Whether a record brings readings the rules judge beyond the train loss (an eval step's val
        loss and the model's internals): the run is diagnosed at that record, so that a finding is
        printed at the step its evidence arrived, not at the next diagnosis tick."""
        return self.every > 0 and any(key in record for key in EVIDENCE)

    def note(self, record: dict[str, Any]) -> None:
        """A record written: its finite losses join the run's level that alarm() judges against."""
        for key in ("train_loss", "val_loss"):
            value = record.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                self.first.setdefault(key, value)
                self.best[key] = min(self.best.get(key, value), value)

    def diagnose(self) -> diagnose.Diagnosis | None:
        try:
            return diagnose.run(self.run_dir)
        except ValueError as err:  # a run with too little history yet: nothing to say
            log.debug("doctor: %s", err)
            return None

    def check(self, failing_only: bool = False) -> list[Finding]:
        """Print the findings (warning and up) whose code was not printed before; return them.
        `failing_only` (an alarm off the cadence): only failures and the divergence, the other
        warnings wait for the cadence. The closing report (`report`) gives every finding as the
        whole run shows it."""
        result = self.diagnose()
        new = [f for f in (result.above_info() if result else []) if f.code not in self.said
               and (not failing_only or f.severity == "failed" or f.code == "divergence")]
        for f in new:
            self.said.add(f.code)
            log.warning("%s", finding_line(f))
        return new

    def report(self) -> diagnose.Diagnosis | None:
        """At the end of training: the verdict, every finding on one line each, what to try."""
        result = self.diagnose()
        if result is None:
            return None
        level = logging.INFO if result.verdict in ("healthy", "too short") else logging.WARNING  # too short: no fault found
        log.log(level, "doctor: %s, %d finding(s) (python -m probes.diagnose --ckpt %s for the evidence)",
                result.verdict, len(result.findings), self.run_dir)
        for f in result.findings:
            log.log(logging.INFO if f.severity == "info" else logging.WARNING, "    %s", finding_line(f)[8:])
        return result


def show_doctor_lines() -> None:
    """The doctor speaks through the "train" logger; in a script that configured no logging, its
    lines (a healthy verdict is INFO) would be lost: give it a plain stderr handler then."""
    doctor_log = logging.getLogger("train")
    if not logging.getLogger().hasHandlers() and not doctor_log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        doctor_log.addHandler(handler)
        doctor_log.setLevel(logging.INFO)
