"""The run doctor: what went wrong in a run, the evidence, and what to change.

    from probes import diagnose
    d = diagnose.run("checkpoints/transformer4_nan")      # a run directory
    d.verdict                                             # 'healthy' | 'warning' | 'failed' | 'too short'
    d.findings[0].code, d.findings[0].fix                 # ranked: severity, then step
    diagnose.run("checkpoints/transformer4_nan", step=3)  # as if the run had stopped at step 3

    python -m probes.diagnose --ckpt checkpoints/transformer4_nan
    python -m probes.diagnose --ckpt runs/x --json --fail-on warning
    python -m probes.diagnose --ckpt out-shakespeare-char --log train.log   # nanoGPT's printed log
    python -m probes.diagnose --ckpt hf-output        # a Trainer's trainer_state.json
    python -m probes.diagnose --ckpt tb-logs --tag Loss/train=train_loss   # TensorBoard events

It reads what training logged (metrics.jsonl, run.json, the snapshot steps on disk; or another
trainer's log): it never loads a model and never retrains, so it answers in well under a second. The doctor itself lives
in `probes.doctor` (history readers, rules, thresholds, findings); this module is its entry point
and keeps `from probes import diagnose` working.
"""

from __future__ import annotations

if __name__ == "__main__":  # Ctrl-C/SIGTERM: one line from here on (see models.interrupts)
    from models.interrupts import quiet_signals
    quiet_signals()

import argparse

from probes.args import diagnose_parser as build_parser
from probes.cli import Shown, json_document, run_probe
from probes.doctor.diagnosis import RULES, VERDICTS, Diagnosis, diagnose_history, run
from probes.doctor.finding import SEVERITIES, Finding

__all__ = ["Diagnosis", "Finding", "RULES", "VERDICTS", "diagnose_history", "main", "run"]

EXIT_FINDING = 1  # --fail-on: a finding at or above the given severity


def main(argv: list[str] | None = None) -> int:
    return run_probe(build_parser, argv, from_args)


def from_args(args: argparse.Namespace) -> Shown:
    result = run(args.ckpt, step=args.step, log=args.log, tags=args.tag)
    failed = args.fail_on and any(SEVERITIES.index(f.severity) >= SEVERITIES.index(args.fail_on)
                                  for f in result.findings)
    return Shown.of(result, code=EXIT_FINDING if failed else 0, as_json=json_document)


if __name__ == "__main__":
    from models.cli import exit_entry
    exit_entry(main())
