"""The end-of-training summary's level follows the verdict: a run too short to judge is said at INFO
(nothing was found wrong), a failed one at WARNING (issue 36's 'too short' verdict, seen from
`python -m train`)."""

from __future__ import annotations

import json
import logging

from train.doctor import LiveDoctor


def write_run(run, losses):
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"model": {"d_vocab": 65}, "train": {"steps": len(losses) - 1}}))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "train_loss": v}) + "\n"
                                               for i, v in enumerate(losses)))


def summary_levels(run, caplog) -> tuple[str, int]:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="train"):
        result = LiveDoctor(run).report()
    return result.verdict, [r.levelno for r in caplog.records if r.getMessage().startswith("doctor:")][0]


def test_too_short_is_said_at_info_and_failed_at_warning(tmp_path, caplog):
    write_run(tmp_path / "short", [4.2, 4.0, 3.9])
    assert summary_levels(tmp_path / "short", caplog) == ("too short", logging.INFO)
    write_run(tmp_path / "nan", [4.2, 4.0, 3.9, float("nan")] + [float("nan")] * 6)
    verdict, level = summary_levels(tmp_path / "nan", caplog)
    assert verdict == "failed" and level == logging.WARNING


def test_the_live_doctor_says_each_finding_once_as_the_run_grows(tmp_path, caplog, monkeypatch):
    from probes.doctor.finding import Finding

    def high(step, where):
        return Finding("update_ratio_high", "warning", "u high", step, "cause", "fix", "ref", where=where)

    found = [[high(0, ("MLP",))], [high(10, ("MLP", "embeddings"))]]
    doctor = LiveDoctor(tmp_path)
    monkeypatch.setattr(doctor, "diagnose", lambda: type("D", (), {"above_info": lambda self: found.pop(0)})())
    with caplog.at_level(logging.WARNING, logger="train"):
        assert len(doctor.check()) == 1 and doctor.check() == []
    assert [r.getMessage().split(":")[1].split()[1] for r in caplog.records] == ["update_ratio_high"]


def steps_said(losses, tmp_path, caplog, lr=0.0) -> dict[str, int]:
    """Each doctor line a Monitor (log_every=5, diagnose_every=25) printed, with the step at whose
    log() call it was printed; the losses logged are these (steps from 1), the model a linear map
    stepped by SGD."""
    import torch

    from train.monitor import Monitor

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    said: dict[str, int] = {}
    with caplog.at_level(logging.WARNING, logger="train"), \
            Monitor(model, optimizer, tmp_path / "run", log_every=5, diagnose_every=25, steps=len(losses),
                    report=False) as monitor:
        for step, loss in enumerate(losses, start=1):
            optimizer.zero_grad()
            model(torch.ones(2, 8)).square().mean().backward()
            optimizer.step()
            monitor.log(step, train_loss=loss)
            for r in caplog.records:
                said.setdefault(r.getMessage(), step)
    return said


def test_a_failure_is_printed_at_the_step_it_is_seen_and_warnings_at_the_cadence(tmp_path, caplog):
    """A NaN at step 32 between log steps, or at a log step, is said at that step's log call; the
    update ratio of an SGD step at lr 1 (a warning) waits for step 25's diagnosis."""
    healthy = [3.0 - step / 100 for step in range(1, 61)]
    for nan_at in (32, 35):
        losses = healthy[:nan_at - 1] + [float("nan")] * (61 - nan_at)
        said = steps_said(losses, tmp_path / f"nan{nan_at}", caplog, lr=1.0)
        divergence = [line for line in said if "[failed] divergence" in line]
        assert len(divergence) == 1 and f"at step {nan_at}" in divergence[0] and said[divergence[0]] == nan_at
        high = [line for line in said if "update_ratio_high" in line]
        assert len(high) == 1 and said[high[0]] >= 25  # at the cadence (record 25, written at step 30)
        caplog.clear()
    rising = healthy[:39] + [9.0] * 21  # a blow-up without NaN: six nats above its best at step 40
    said = steps_said(rising, tmp_path / "rise", caplog)
    blown = [line for line in said if "divergence" in line]
    assert len(blown) == 1 and said[blown[0]] == 40 and "rising" in blown[0]


def test_a_warning_is_printed_when_its_evidence_arrives_not_at_the_next_tick(tmp_path, caplog):
    """diagnose_every=100 on a 60-step run: the val loss logged with each record (an eval step's
    evidence) rises from step 25 while the train loss falls: overfitting, printed at the log call
    that writes record 25 (step 30), not at a diagnosis tick the run never reaches."""
    import torch

    from train.monitor import Monitor

    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    said: dict[str, int] = {}
    with caplog.at_level(logging.WARNING, logger="train"), \
            Monitor(model, optimizer, tmp_path / "run", log_every=5, diagnose_every=100, steps=60,
                    report=False) as monitor:
        for step in range(1, 61):
            optimizer.zero_grad()
            model(torch.ones(2, 8)).square().mean().backward()
            optimizer.step()
            val = 3.0 - step / 100 if step < 25 else 2.8 + (step - 20) / 20
            monitor.log(step, train_loss=3.0 - step / 50, **({"val_loss": val} if step % 5 == 0 else {}))
            for r in caplog.records:
                said.setdefault(r.getMessage(), step)
    overfit = [line for line in said if "overfitting" in line]
    assert len(overfit) == 1 and said[overfit[0]] == 30, said
