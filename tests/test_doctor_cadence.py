"""One run, one verdict at any eval cadence: the same run's readings taken every 10 steps or every
100 give the same verdict and findings, as a whole and as the live doctor reads it step by step
(the run cut at each logged step); a real blow-up is still warned of well before it happens.

The runs are written by hand from smooth curves, so what each cadence sees is known on paper: a
healthy GPT-2-style run whose residual stream grows from its init's 0.04 to 0.84 (with Adam's
early overshoot around step 20) and whose sharpest heads' scores grow from 0.1 to 14 and level
off; and a run whose stream grows from 1.5 by e every 60 steps until its loss is NaN at step 600.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from probes import diagnose

STEPS, LOG_EVERY = 1000, 10
BLOW_UP = 600  # the blow-up's loss is NaN from here


def healthy(step: int) -> dict:
    overshoot = 0.5 * math.exp(-((step - 20) / 8) ** 2)  # Adam's first steps: a transient, then settled
    return {"resid_rms": {"0": 0.04 + 0.8 * (1 - math.exp(-step / 15)) + overshoot},
            "attn_logit_max": {"0": [0.1 + 14 * (1 - math.exp(-step / 200)), 0.1 + 3 * (1 - math.exp(-step / 200))]},
            "logit_max": 1.0 + 5 * (1 - math.exp(-step / 100))}


def blowing_up(step: int) -> dict:
    return {"resid_rms": {"0": 1.5 * math.exp(step / 60)}, "attn_logit_max": {"0": [2.0, 1.0]}, "logit_max": 3.0}


def write(root: Path, readings, eval_every: int, nan_from: int | None = None) -> Path:
    """A run logging its loss every LOG_EVERY steps and `readings(step)` every `eval_every`."""
    root.mkdir(parents=True)
    records = []
    for step in range(0, STEPS + 1, LOG_EVERY):
        loss = 1.5 + 2.67 * math.exp(-step / 300)
        record = {"step": step, "lr": 1e-3, "train_loss": None if nan_from is not None and step >= nan_from else loss}
        if step % eval_every == 0:
            record.update(readings(step))
        records.append(record)
        if record["train_loss"] is None:
            break
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    info = {"model": {"family": "transformer", "d_vocab": 65, "n_ctx": 16},
            "train": {"optimizer": "adamw", "lr": 1e-3, "steps": STEPS, "eval_every": eval_every}}
    (root / "run.json").write_text(json.dumps(info))
    return root


def judged(d: diagnose.Diagnosis) -> tuple:
    return d.verdict, sorted((f.code, f.severity) for f in d.findings)


def live_warnings(run: Path) -> list[tuple[int, str]]:
    """(step, code) of each warning the live doctor would print: the run cut at each logged step."""
    said: dict[str, int] = {}
    for step in range(0, STEPS + 1, LOG_EVERY):
        try:
            found = diagnose.run(run, step=step).above_info()
        except ValueError:  # cut past the last record
            break
        for f in found:
            said.setdefault(f.code, step)
    return sorted((s, c) for c, s in said.items())


def test_a_healthy_run_reads_the_same_at_eval_every_10_and_100(tmp_path):
    fine, coarse = (write(tmp_path / f"every{e}", healthy, e) for e in (10, 100))
    assert judged(diagnose.run(fine)) == judged(diagnose.run(coarse))
    assert diagnose.run(fine).verdict == "healthy"
    assert live_warnings(fine) == live_warnings(coarse) == []  # no early alarm from the untrained readings


@pytest.mark.parametrize("eval_every", [10, 100])
def test_a_blow_up_is_still_warned_of_long_before_it_happens(tmp_path, eval_every):
    run = write(tmp_path / "run", blowing_up, eval_every, nan_from=BLOW_UP)
    result = diagnose.run(run)
    assert result.verdict == "failed" and result.findings[0].code == "divergence"
    first = next(s for s, code in live_warnings(run) if code == "resid_rms_growth")
    # on paper: 1.5 * e^(s/60) is ten-fold grown from s = 60 ln 10 = 138 on, and doubles every
    # 60 ln 2 = 42 steps: warned (still growing) at the next reading, or within one doubling
    grown, doubling = 60 * math.log(10), 60 * math.log(2)
    assert grown < first <= grown + max(eval_every, doubling + LOG_EVERY)
    assert BLOW_UP - first >= 400
