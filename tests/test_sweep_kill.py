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
from train.run_lock import RunLock, lock_holder
from train.sweep.cli import main

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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_run_hears_sigint_even_when_its_starter_blocks_it(tmp_path):
    from train.sweep.local import launch

    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # as a Ray worker does
    try:
        proc = launch(["grep", "^SigBlk", "/proc/self/status"], tmp_path / "mask.log")
        assert proc.wait() == 0
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    blocked = int((tmp_path / "mask.log").read_text().split()[1], 16)
    assert not blocked & (1 << (signal.SIGINT - 1)) and not blocked & (1 << (signal.SIGTERM - 1))


@pytest.mark.slow
def test_ctrl_c_stops_a_ray_sweeps_runs_and_each_says_so(text_file, tmp_path):  # noqa: F811
    pytest.importorskip("ray")
    out = tmp_path / "ray"
    argv = [*sweep_args(text_file, out, "--backend", "ray")[:-4], "--workers", "2", "--lr", "0.01,0.02",
            "--steps", "100000", "--log-every", "1", "--backend", "ray"]
    argv = [a for i, a in enumerate(argv) if not (a == "--vary" or (i and argv[i - 1] == "--vary"))]
    driver = subprocess.Popen([sys.executable, "-m", "train.sweep", *argv], cwd=REPO, stderr=subprocess.PIPE,
                              text=True, env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    runs = [out / "lr=1e-02", out / "lr=2e-02"]
    training = lambda r: lock_holder(r) and (r / "metrics.jsonl").is_file() \
        and len((r / "metrics.jsonl").read_text().splitlines()) > 3  # noqa: E731
    assert wait_for(lambda: all(training(r) for r in runs), 180), "the runs never started"
    children = [int(lock_holder(r)) for r in runs]
    driver.send_signal(signal.SIGINT)
    _, err = driver.communicate(timeout=120)
    assert driver.returncode == 130, err
    assert not [pid for pid in children if alive(pid)]
    book = {r["name"]: r for r in json.loads((out / "sweep.json").read_text())["runs"]}
    for run in runs:
        last_line = (out / "logs" / f"{run.name}.log").read_text().strip().splitlines()[-1]
        assert "interrupted at step" in last_line, last_line
        last_step = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["step"]
        assert book[run.name]["status"] == "interrupted" and book[run.name]["last_step"] == last_step
    assert "Ray task failed" not in err
