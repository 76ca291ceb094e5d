"""A sweep's driver that dies takes its runs with it, a --resume never touches a run that a live
process still trains, and a Ray cluster address nothing answers at is one line at once (Ray itself
retries for ever)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_sweep import sweep_args, text_file  # noqa: F401  (the fixture)
from train.guard import RunLock, lock_holder
from train.sweep import main

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "checkpoints" / "sweep_qk_norm" / "sweep.json"


def wait_for(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie has exited: only its entry is left
        return stat.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's parent-death signal is Linux's")
def test_a_killed_driver_takes_its_runs_with_it(text_file, tmp_path):  # noqa: F811
    out = tmp_path / "long"
    argv = [*sweep_args(text_file, out)[:-2], "--workers", "1", "--steps", "100000", "--log-every", "1"]
    driver = subprocess.Popen([sys.executable, "-m", "train.sweep", *argv], cwd=REPO, stderr=subprocess.DEVNULL,
                              env=dict(os.environ, PYTHONPATH=str(REPO)))
    run = out / "lr=1e-02,qk_norm=none"
    assert wait_for(lambda: (run / "metrics.jsonl").is_file() and lock_holder(run), 120), "the run never started"
    child = int(lock_holder(run))
    driver.kill()
    driver.wait()
    assert wait_for(lambda: not alive(child), 60), f"run pid {child} still trains after its driver was killed"
    assert lock_holder(run) is None


def test_a_resume_refuses_while_a_run_is_still_trained_and_changes_nothing(tmp_path, capsys):
    out = tmp_path / "sweep"
    out.mkdir()
    shutil.copy(SHIPPED, out / "sweep.json")
    live = out / json.loads(SHIPPED.read_text())["runs"][3]["dir"]
    live.mkdir()
    (live / "metrics.jsonl").write_text('{"step": 0, "train_loss": 4.2}\n')
    lock = RunLock(live).acquire()  # as a trainer left running by a killed driver holds it
    try:
        before = {p.name: p.read_bytes() for p in [out / "sweep.json", live / "metrics.jsonl"]}
        assert main(["--out", str(out), "--resume"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error:") and live.name in err and f"pid {os.getpid()}" in err, err
        assert {p.name: p.read_bytes() for p in [out / "sweep.json", live / "metrics.jsonl"]} == before
    finally:
        lock.release()
    assert lock_holder(live) is None


def test_lock_holder_names_the_pid_only_while_the_lock_is_held(tmp_path):
    assert lock_holder(tmp_path) is None and lock_holder(tmp_path / "missing") is None
    lock = RunLock(tmp_path).acquire()
    assert lock_holder(tmp_path) == str(os.getpid())
    lock.release()
    assert lock_holder(tmp_path) is None


@pytest.mark.parametrize("address", ["127.0.0.1:1", "ray://127.0.0.1:1", "no-port-here"])
def test_a_ray_address_nothing_answers_at_is_one_line_at_once(address, text_file, tmp_path, monkeypatch, capsys):  # noqa: F811
    pytest.importorskip("ray")
    monkeypatch.setenv("RAY_ADDRESS", address)
    assert main(sweep_args(text_file, tmp_path / "s", "--backend", "ray")) == 2  # pytest-timeout bounds a hang
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --backend ray:") and address in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "s").exists()
