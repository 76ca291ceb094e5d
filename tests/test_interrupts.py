"""Ctrl-C and SIGTERM at any moment of a CLI: one line, exit 130 / 143, never a traceback, and
in training the last step kept, no temporary save folder and no lock file left behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from models.checkpoint import list_snapshots, load_snapshot
from models.interrupts import EXIT_INTERRUPTED, EXIT_TERMINATED, deferred_signals, raising_signals
from train.loop import main

REPO = Path(__file__).resolve().parent.parent
TEXT = "the king and queen shall not be what thou art, and my good lord.\n" * 60
WORD = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}
CODE = {signal.SIGINT: EXIT_INTERRUPTED, signal.SIGTERM: EXIT_TERMINATED}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "t.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def train_cmd(data: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "train", "--preset", "transformer4_rms_small", "--data", str(data),
            "--out", str(out), "-q", "--batch-size", "4", "--steps", "100000", *extra]


def catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler for SIGTERM (Python has none by default: ours is in)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(re.search(r"^SigCgt:\s*([0-9a-f]+)$", status, re.M).group(1), 16)
    return bool(caught >> (signal.SIGTERM - 1) & 1)


def signal_after(cmd: list[str], sig: int, delay: float) -> tuple[int | None, list[str]]:
    """Start `cmd`, wait until its entry installed its handlers, then `delay` s more, and signal it.
    (returncode or None if it had already finished, stderr lines)."""
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 60
    while proc.poll() is None and not catches_sigterm(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(delay)
    finished = proc.poll() is not None
    if not finished:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    return None if finished else proc.returncode, err.strip().splitlines()


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads /proc/PID/status")
@pytest.mark.parametrize("which, sig, delays", [
    ("probe", signal.SIGINT, (0.0, 0.6, 2.0)),
    ("probe", signal.SIGTERM, (1.2,)),
    ("train", signal.SIGTERM, (0.0, 0.6, 2.0)),
    ("train", signal.SIGINT, (1.2,)),
], ids=["probe-SIGINT", "probe-SIGTERM", "train-SIGTERM", "train-SIGINT"])
def test_a_signal_at_any_moment_of_start_up_is_one_line(which, sig, delays, data, tmp_path):
    """From the entry's first statement on (imports, parsing, loading, building) the outcome is
    the same wherever the signal lands; the signal used to print a 20-50 line traceback."""
    for i, delay in enumerate(delays):
        out = tmp_path / f"run{i}"
        cmd = train_cmd(data, out) if which == "train" else [
            sys.executable, "-m", "probes.entropy", "--ckpt", str(REPO / "checkpoints" / "shakespeare_rms4"),
            "--text", "ROMEO: But soft, what light"]
        rc, lines = signal_after(cmd, sig, delay)
        if rc is None:  # it finished first (a fast machine): nothing to interrupt
            continue
        assert rc == CODE[sig] and len(lines) == 1, (delay, rc, lines)
        # training that reached its loop says which step it kept
        assert lines[0] == WORD[sig] or re.search(f"{WORD[sig]} at step \\d+: saved step_", lines[0]), lines
        assert not out.exists() or not [p.name for p in out.iterdir() if p.name.startswith(".")]


def test_sigterm_mid_step_keeps_the_last_step_and_exits_143(data, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(train_cmd(data, out, "--log-every", "1", "--eval-every", "1000",
                                      "--save-every", "0"),
                            cwd=REPO, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 120
    metrics = out / "metrics.jsonl"
    while time.monotonic() < deadline and proc.poll() is None and not (
            metrics.is_file() and metrics.read_text().count("\n") >= 3):  # steps 0, 1, 2 logged
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    lines = err.strip().splitlines()
    assert proc.returncode == EXIT_TERMINATED and len(lines) == 1, lines
    step = int(re.search(r"terminated at step (\d+): saved step_\d{6}$", lines[0]).group(1))
    assert step >= 2 and load_snapshot(list_snapshots(out)[-1]).step == step
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []  # no lock, no temp


@pytest.mark.parametrize("nth_save, line", [(1, "terminated"), (2, "terminated at step 2")])
def test_sigterm_mid_save_finishes_the_save_then_exits_143(nth_save, line, data, tmp_path, monkeypatch,
                                                          capsys, caplog):
    """The signal comes after the weights are written, before config.json and the rename: the
    save completes (it used to leave .step_N.tmp-PID behind), then the run stops there."""
    import models.store.snapshot as checkpoint

    real, calls = checkpoint.save_file, []

    def save_file_then_sigterm(*args, **kwargs):
        real(*args, **kwargs)
        calls.append(1)
        if len(calls) == nth_save:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(checkpoint, "save_file", save_file_then_sigterm)
    out = tmp_path / "run"
    rc = main(["--preset", "transformer4_rms_small", "--data", str(data), "--out", str(out), "-q",
               "--batch-size", "4", "--steps", "6", "--save-every", "2", "--log-every", "2"])
    said = capsys.readouterr().err.strip().splitlines() + [
        r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert rc == EXIT_TERMINATED and len(said) == 1 and said[0].startswith(line), said
    assert [p.name for p in list_snapshots(out)] == ["step_000000", "step_000002"][:nth_save]
    assert all(load_snapshot(p) for p in list_snapshots(out))
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]


def test_deferred_signals_wait_for_the_block_then_reach_the_handler_before():
    # the handler the block restores is set here: pytest started as a background job (or under
    # `trap '' INT`) inherits SIGINT ignored, and the test must not depend on how it was started
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    order = []
    try:
        with pytest.raises(KeyboardInterrupt):
            with raising_signals():
                with deferred_signals():
                    os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(0.05)  # a handler runs between bytecodes: it would have run by now
                    order.append("block done")
        assert order == ["block done"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # all restored
    finally:
        signal.signal(signal.SIGINT, previous)


def test_an_entry_leaves_with_its_code_at_once_and_runs_atexit_unless_stopped(tmp_path):
    """`exit_entry` (every `python -m` entry's last call): the status is the code itself, with what
    was printed flushed first; after a normal end atexit's functions run, and the interpreter's
    teardown (during which Python's default signal handlers are back, so a Ctrl-C there killed the
    process with no line: the start-up test above saw it) is skipped; after a signal nothing runs."""
    for code in (0, 2):
        done = subprocess.run([sys.executable, "-c", "import atexit; from models.cli import exit_entry; "
                               "atexit.register(print, 'atexit ran', end=''); print('kept', end=''); "
                               f"exit_entry({code})"], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert done.returncode == code and done.stdout == "keptatexit ran"
    for code in (130, 143):
        done = subprocess.run([sys.executable, "-c", "import atexit; from models.cli import exit_entry; "
                               "atexit.register(print, 'atexit ran'); print('kept', end=''); "
                               f"exit_entry({code})"], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert done.returncode == code and done.stdout == "kept"  # flushed; no interpreter exit ran after it
