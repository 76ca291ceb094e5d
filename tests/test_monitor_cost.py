"""What the Monitor does inside the user's loop (issue 53): the hooked twin its eval steps read is
built when the Monitor is made (building it imports TransformerLens: seconds that stalled the
user's first eval step), and metrics.jsonl is fsynced on a clock, not once per record, while
every record is written at once and a rescue or a divergence reaches the disk at once."""

from __future__ import annotations

import os

import torch
from test_monitor import CONFIG, backward, nanogpt, open_monitor

import models.store.run as run_store
from models.checkpoint import read_metrics


def test_the_twin_is_built_with_the_monitor_and_reused_at_eval_steps(tmp_path):
    model = nanogpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    eval_tokens = torch.randint(0, CONFIG.vocab_size, (2, CONFIG.block_size), generator=torch.Generator().manual_seed(1))
    with open_monitor(model, optimizer, tmp_path / "run", eval_tokens=eval_tokens, eval_every=2) as monitor:
        built = monitor._eval._twin
        assert built is not None and built is not model  # our twin over the nanoGPT module's weights
        for step in range(5):
            backward(model, optimizer, seed=step)
            optimizer.step()
            monitor.log(step, train_loss=1.0)
        assert monitor._eval._twin is built  # the optimizer's in-place steps keep it: never rebuilt
    records = {r["step"]: r for r in read_metrics(tmp_path / "run")}
    assert all(len(records[s]["attn_entropy"]) == CONFIG.n_layer for s in (0, 2, 4))  # read on that twin


def counted_fsyncs(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        calls.append(fd)
        real(fd)
    monkeypatch.setattr(run_store.os, "fsync", fsync)
    return calls


def test_records_are_written_at_once_and_fsynced_on_a_clock(tmp_path, monkeypatch):
    calls = counted_fsyncs(monkeypatch)
    model = nanogpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    out = tmp_path / "run"
    with open_monitor(model, optimizer, out, log_every=1) as monitor:
        for step in range(12):
            backward(model, optimizer, seed=step)
            optimizer.step()
            monitor.log(step, train_loss=1.0)
            monitor.flush()
            assert [r["step"] for r in read_metrics(out)][-1] == step  # on disk (the OS's) at once
        during = len(calls)
    assert 1 <= during <= 3  # the first record, then one per SYNC_EVERY_S at most (12 quick steps)
    assert len(calls) == during + 1  # the close reaches the disk


def test_a_diverged_record_is_fsynced_at_once(tmp_path, monkeypatch):
    calls = counted_fsyncs(monkeypatch)
    model = nanogpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with open_monitor(model, optimizer, tmp_path / "run", log_every=1) as monitor:
        for step, loss in enumerate([1.0, 1.0, float("nan")]):
            backward(model, optimizer, seed=step)
            optimizer.step()
            monitor.log(step, train_loss=loss)
            monitor.flush()
            if step == 1:
                before = len(calls)
        assert len(calls) == before + 1  # the NaN step's record: synced though the clock was not due
