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
