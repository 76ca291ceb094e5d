"""The run doctor during training: `--diagnose-every N` reads the run so far every N steps and
prints each new finding once; when training stops (finished, interrupted or diverged) the whole
diagnosis is printed. The findings come from `probes.diagnose`, on what training just logged."""

from __future__ import annotations

import logging
from pathlib import Path

from probes import diagnose
from probes.doctor.finding import Finding

log = logging.getLogger("train")

__all__ = ["LiveDoctor"]


def finding_line(f: Finding) -> str:
    return f"doctor: [{f.severity}] {f.code} at step {f.step}: {f.title}" + (f"; try: {f.fix}" if f.fix else "")


class LiveDoctor:
    """Diagnoses one run directory as it grows; remembers what it already said."""

    def __init__(self, run_dir: Path, every: int = 0):
        self.run_dir = Path(run_dir)
        self.every = every
        self.said: set[str] = set()  # codes printed: a finding whose parameters or step move as the
        # run grows is the same finding (update_ratio_high was printed twice, for other groups)

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    def diagnose(self) -> diagnose.Diagnosis | None:
        try:
            return diagnose.run(self.run_dir)
        except ValueError as err:  # a run with too little history yet: nothing to say
            log.debug("doctor: %s", err)
            return None

    def check(self) -> list[Finding]:
        """Print the findings (warning and up) whose code was not printed before; return them. The
        closing report (`report`) gives every finding as the whole run shows it."""
        result = self.diagnose()
        new = [f for f in (result.above_info() if result else []) if f.code not in self.said]
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
