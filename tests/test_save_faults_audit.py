"""Saves under faults and reads that race them (issue 50's audit, in our words): a failed save is
said, never raised into the loop (issue 60: tests/test_monitor_write_faults.py), and its step's
record is kept; a snapshot left aside by a save killed mid-swap is named where --ckpt looks for it; the app's
file stamps skip a write's temporary that is renamed away meanwhile."""

from __future__ import annotations

import os
import pathlib

import pytest
import torch
import torch.nn.functional as F
from gpt_kit import PerHeadGPT

from models.store.files import CheckpointError
from train.monitor import Monitor
from train.monitor.core import Monitor as MonitorCore

VOCAB = 40


def test_a_failed_save_is_said_and_its_steps_record_is_kept(tmp_path, monkeypatch, caplog):
    from models.store.run import read_metrics

    def no_space(self, step):
        raise CheckpointError(f"no space left on the device holding {self.out_dir}: snapshot not saved")

    unlink = pathlib.Path.unlink

    def read_only_lock(path, *args, **kwargs):  # the run folder made read-only: the lock file stays
        if path.name == ".train.lock":
            raise PermissionError(13, "Permission denied", str(path))
        return unlink(path, *args, **kwargs)

    torch.manual_seed(0)
    model = PerHeadGPT(vocab=VOCAB)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    monkeypatch.setattr(MonitorCore, "_save_now", no_space)
    monkeypatch.setattr(pathlib.Path, "unlink", read_only_lock)
    with Monitor(model, optimizer, tmp_path / "run", log_every=1, save_every=2, eval_tokens=x, report=False) as m:
        for step in range(3):
            loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            m.log(step, train_loss=loss.item())
    records = read_metrics(tmp_path / "run")  # step 0's save failed, and the loop went on
    assert [r["step"] for r in records] == [0, 1, 2] and all("train_loss" in r for r in records)
    assert sum("no space left" in r.getMessage() for r in caplog.records) == 2  # when it failed, at close
    monkeypatch.undo()
    Monitor(model, optimizer, tmp_path / "run", resume=True, report=False).close()  # the lock was let go


def test_a_snapshot_left_aside_by_a_killed_save_is_named(tmp_path):
    from models.store import load_checkpoint

    (tmp_path / "run" / f".step_000100.old-{os.getpid()}").mkdir(parents=True)  # renamed aside, never back
    with pytest.raises(CheckpointError, match=r"step_000100: not found; an interrupted save left the previous "
                                              r"version at .*\.step_000100\.old-\d+ \(rename it back"):
        load_checkpoint(tmp_path / "run" / "step_000100")


def test_the_apps_stamps_skip_a_temporary_renamed_away(tmp_path):
    from app.data import mtime

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / ".first_view.safetensors.x1y2.tmp").symlink_to(tmp_path / "gone")  # listed, then gone
    (tmp_path / "first_view.safetensors").symlink_to(tmp_path / "gone too")  # between listing and stat
    assert mtime(tmp_path) == (tmp_path / "config.json").stat().st_mtime  # the same stat, read twice
