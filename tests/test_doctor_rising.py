"""The divergence rule on a loss that rises without turning NaN (a sweep's too-high learning
rates): a warning while the loss is below where it started or the run goes on, a failure when the
run ended above it."""

from __future__ import annotations

from probes import diagnose
from tests.test_diagnose import write_run


def losses(values: list[float]) -> list[dict]:
    return [{"step": 10 * i, "train_loss": v} for i, v in enumerate(values)]


def divergence(run, step: int | None = None) -> diagnose.Finding | None:
    return next((f for f in diagnose.run(run, step=step).findings if f.code == "divergence"), None)


def test_a_loss_rising_a_nat_above_its_best_but_below_its_start_is_a_warning(tmp_path):
    found = divergence(write_run(tmp_path / "w", losses([4.2, 3.0, 2.5, 2.6, 3.8])))  # best 2.5, +1.3
    assert found is not None and found.severity == "warning" and found.step == 40
    assert "is rising: 2.50 at step 20 -> 3.80 at step 40" in found.title
    assert diagnose.run(tmp_path / "w").verdict == "warning"


def test_a_loss_that_ends_above_its_first_value_failed(tmp_path):
    found = divergence(write_run(tmp_path / "f", losses([4.2, 3.0, 2.5, 9.0, 67.1])))
    assert found is not None and found.severity == "failed" and found.step == 30
    assert found.title.startswith("the run diverged: the train loss ended at 67.10 (step 40), above its first value 4.20")
    assert found.evidence["first_loss"] == 4.2 and found.evidence["best_loss"] == 2.5
    assert diagnose.run(tmp_path / "f").verdict == "failed"
    going = write_run(tmp_path / "g", losses([4.2, 3.0, 2.5, 9.0, 67.1]), train={"steps": 1000})
    assert divergence(going).severity == "warning"  # still training: NaN would be its failure
    assert divergence(tmp_path / "f", step=30).severity == "warning"  # cut before the end


def test_a_loss_that_only_falls_has_no_divergence(tmp_path):
    assert divergence(write_run(tmp_path / "h", losses([4.2, 3.0, 2.5, 2.4, 2.3]))) is None


def test_a_loss_rising_from_the_first_steps_stays_a_warning_until_it_overflows(tmp_path):
    live = write_run(tmp_path / "e", losses([8.3, 12.6, 14.8]), train={"steps": 3000})  # transformer4_nan
    found = divergence(live)
    assert found is not None and found.severity == "warning"


def test_a_loss_blown_up_before_the_first_train_log_is_read_from_the_val_loss(tmp_path):
    """Logged every 50 steps, the train loss is already 80 at its first record and falls to 67; the
    val loss at step 0 (5.7) shows the run ended far above where it began."""
    records = [{"step": 0, "val_loss": 5.7}] + [
        {"step": s, "train_loss": 80.0 - s / 50, "val_loss": 81.0 - s / 50} for s in range(50, 650, 50)]
    found = divergence(write_run(tmp_path / "v", records))
    assert found is not None and found.severity == "failed" and found.where == ("val loss",) and found.step == 50
