"""The broken run told right: healthy for 200 steps, then its learning rate x170 (a schedule bug,
a wrong unit): the loss jumps, then sits at the untrained model's level, ln(vocab), to the end.
The doctor calls it FAILED, its cause the event at step 200 read from the records (the rate), not
the healthy first half; the val loss's jump of several nats is a divergence, never overfitting,
also for the live doctor reading the run cut at each logged step."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from probes import diagnose

VOCAB, BREAK, STEPS = 65, 200, 400
UNTRAINED = math.log(VOCAB)  # 4.17: a uniform guess


def train_loss(step: int) -> float:
    if step < BREAK:
        return 2.3 + (UNTRAINED - 2.3) * math.exp(-step / 50)
    return UNTRAINED - 0.03 + 6.0 * math.exp(-(step - BREAK) / 15)  # the jump, then the untrained level


def write(root: Path) -> Path:
    root.mkdir(parents=True)
    records = []
    for step in range(0, STEPS + 1, 10):
        # the val loss, evaluated before the step, jumps at 250 while that step's train loss is still low
        record = {"step": step, "lr": 1e-3 if step < BREAK else 0.17,
                  "train_loss": train_loss(step) if step != 250 else 2.25}
        if step % 50 == 0:  # val a little above train; 6.76 nats up at the first eval after the break
            record["val_loss"] = train_loss(step) + 0.05 if step != 250 else 2.3 + 6.76
            sharp = 0.1 + 12 * (1 - math.exp(-step / 40))  # heads sharpening in the healthy half
            record["attn_logit_max"] = {"0": [sharp if step < BREAK else sharp * 40]}
        records.append(record)
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    info = {"model": {"family": "transformer", "d_vocab": VOCAB, "n_ctx": 16},
            "train": {"optimizer": "adamw", "lr": 1e-3, "steps": STEPS}}
    (root / "run.json").write_text(json.dumps(info))
    return root


@pytest.fixture(scope="module")
def broken(tmp_path_factory) -> Path:
    return write(tmp_path_factory.mktemp("broken") / "run")


def test_a_run_ending_at_the_untrained_level_is_failed_at_its_break(broken):
    result = diagnose.run(broken)
    first = result.findings[0]
    assert result.verdict == "failed" and first.code == "divergence" and first.severity == "failed"
    assert first.step == BREAK and first.warning_step == BREAK  # the event, not the healthy half's signals
    assert first.evidence["lr_before"] == pytest.approx(1e-3) and first.evidence["lr_after"] == pytest.approx(0.17)
    assert "x170" in first.cause and f"step {BREAK}" in first.cause


def test_a_val_jump_of_several_nats_is_never_overfitting(broken):
    for cut in range(250, STEPS + 1, 10):  # as the live doctor reads the run from the jump on
        codes = [f.code for f in diagnose.run(broken, step=cut).findings]
        assert "overfitting" not in codes and "divergence" in codes, (cut, codes)
