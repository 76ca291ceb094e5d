"""Advice that fits the run (issue 38, item 3): a shipped sweep run (made by `python -m train
--save-every 0`, its snapshots removed) is not told to give a Monitor `save_every`; it is told its own
command. And a tuned lens is never trained on a snapshot whose weights are NaN: one line, nothing
saved, and the app does not offer the command for such a snapshot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app_kit import open_app

SHIPPED = Path(__file__).resolve().parent.parent / "checkpoints"
SWEEP_RUN = "sweep_qk_norm/lr=1e-01,qk_norm=rms"


@pytest.mark.parametrize("page", ["attention", "overview"])
def test_a_sweep_run_is_told_its_own_command_not_the_monitors(page, monkeypatch):
    at = open_app(monkeypatch, page=page, run=SWEEP_RUN)
    said = " ".join(i.value for i in at.info)
    command = json.loads((SHIPPED / SWEEP_RUN / "run.json").read_text())["command"]
    assert "training history only" in said and command in said, said
    assert "Monitor" not in said and "save_every=N" not in said, said


def test_a_tuned_lens_is_not_trained_on_nan_weights(tmp_path, capsys):
    import shutil

    from probes import tuned_lens

    snap = tmp_path / "step_000005"
    shutil.copytree(SHIPPED / "transformer4_nan" / "step_000005", snap)
    before = sorted(p.name for p in snap.iterdir())
    code = tuned_lens.main(["--ckpt", str(snap), "--steps", "5", "--data", str(SHIPPED.parent / "data" / "tinyshakespeare.txt")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "diverged snapshot" in err and str(snap) in err, err
    assert sorted(p.name for p in snap.iterdir()) == before  # no NaN lens saved beside it


def test_the_logit_lens_page_does_not_offer_the_command_for_a_nan_snapshot(monkeypatch):
    at = open_app(monkeypatch, page="lens", run="transformer4_nan")
    infos = " ".join(i.value for i in at.info)
    assert "diverged" in infos and "python -m probes.tuned_lens" not in infos, infos
