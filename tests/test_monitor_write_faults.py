"""A run folder that stops taking writes mid-run never ends the training the Monitor watches
(issue 60): made read-only, a disk filling up (a record's line cut mid-write), a snapshot too big
for what is left. Running as root, a chmod'ed folder stays writable: the faults are simulated by
monkeypatching the writes (`open` of metrics.jsonl, the snapshot's temporary folder, the lock's
unlink) from one step on. The loop runs to its end; one warning says it, another at close;
metrics.jsonl holds whole lines up to the failure."""

from __future__ import annotations

import errno
import io
import json
import logging
import pathlib

import pytest
import torch
import torch.nn.functional as F
from gpt_kit import PerHeadGPT

import models.store.run as store_run
from models.store.run import read_metrics_log
from probes.doctor.run_history import RunHistory
from train.monitor import Monitor

VOCAB, STEPS, ARMED = 40, 6, 3  # the fault from the log call of step 3: it writes step 2's record


class HalfWritten(io.FileIO):
    """A disk that fills up as a line is written: half of it lands, then ENOSPC."""
    cut_back_fails = False

    def write(self, data):
        super().write(bytes(data)[:len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    def truncate(self, size=None):
        if self.cut_back_fails and size is not None and size > 0:
            raise OSError(errno.EIO, "Input/output error")
        return super().truncate(size)


class CutBackFails(HalfWritten):
    cut_back_fails = True


CASES = {  # name: (metrics.jsonl's fault, the snapshot folder's errno, the lock file stays, records kept, saved)
    "read-only folder": ("read-only", errno.EROFS, True, [0, 1], [0, 2]),
    "disk full": (HalfWritten, errno.ENOSPC, False, [0, 1], [0, 2]),
    "disk full, the torn line not cut back": (CutBackFails, errno.ENOSPC, False, [0, 1], [0, 2]),
    "a snapshot too big for the disk": (None, errno.ENOSPC, False, list(range(STEPS)), [0, 2]),
}


def arm(monkeypatch, run: pathlib.Path, case: tuple) -> dict:
    metrics_fault, snapshot_errno, lock_stays = case[:3]
    armed = {"on": False}
    real_open, real_mkdir, real_unlink = open, pathlib.Path.mkdir, pathlib.Path.unlink

    def metrics_open(path, mode="r", *args, **kwargs):
        if not armed["on"] or metrics_fault is None or "a" not in mode:
            return real_open(path, mode, *args, **kwargs)
        if metrics_fault == "read-only":
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return metrics_fault(path, "a+")

    def mkdir(path, *args, **kwargs):  # the snapshot's temporary folder, .step_NNNNNN.tmp-<pid>
        if armed["on"] and path.parent == run and path.name.startswith("."):
            raise OSError(snapshot_errno, "No space left on device" if snapshot_errno == errno.ENOSPC
                          else "Read-only file system", str(path))
        return real_mkdir(path, *args, **kwargs)

    def unlink(path, *args, **kwargs):
        if armed["on"] and lock_stays and path.name == ".train.lock":
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(store_run, "open", metrics_open, raising=False)
    monkeypatch.setattr(pathlib.Path, "mkdir", mkdir)
    monkeypatch.setattr(pathlib.Path, "unlink", unlink)
    return armed


@pytest.mark.parametrize("name", CASES)
def test_a_run_folder_that_stops_taking_writes_never_ends_the_training(tmp_path, monkeypatch, caplog, name):
    case, run = CASES[name], tmp_path / "run"
    torch.manual_seed(0)
    model = PerHeadGPT(vocab=VOCAB)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    armed = arm(monkeypatch, run, case)
    caplog.set_level(logging.WARNING, logger="train.monitor")
    with Monitor(model, optimizer, run, log_every=1, save_every=2, eval_tokens=x, report=False) as monitor:
        for step in range(STEPS):
            loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            armed["on"] = armed["on"] or step == ARMED
            monitor.log(step, train_loss=loss.item())  # never raises: the loop reaches its end
    monkeypatch.undo()
    said = [r.getMessage() for r in caplog.records if r.name == "train.monitor" and r.levelno == logging.WARNING]
    failed_step = 2 if case[0] is not None else 4  # a record's write, else the snapshot's
    assert len(said) == 2 and all(f"at step {failed_step} not written" in line for line in said), said
    assert "\n" not in said[0] and str(run) in said[0]
    text = (run / "metrics.jsonl").read_text()
    whole = text.splitlines()[:-1] if not text.endswith("\n") else text.splitlines()
    assert [json.loads(line)["step"] for line in whole] == case[3]  # every whole line a record, in order
    assert text.endswith("\n") or case[0] is CutBackFails  # a torn end only where cutting it back failed too
    metrics = read_metrics_log(run)  # the torn end is a write cut off, read past: no record skipped
    assert [r["step"] for r in metrics.records] == case[3] and not metrics.skipped
    assert RunHistory.read(run).series("train_loss")[-1][0] == case[3][-1]
    assert sorted(p.name for p in run.glob("step_*")) == [f"step_{s:06d}" for s in case[4]]
    Monitor(model, optimizer, run, resume=True, report=False).close()  # the lock was let go
