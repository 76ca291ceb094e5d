"""The local backend of `train.sweep`: each grid point is a `python -m train` process with one
torch thread (OMP_NUM_THREADS=1), at most --workers at a time; its console goes to its log file.

Each process runs in its own session, so a Ctrl-C at the terminal reaches the driver alone; the
driver then asks every live run to stop (SIGINT: the trainer finishes its step, saves a snapshot
and exits 130) and waits for them before it writes sweep.json and leaves. A driver killed outright
(SIGKILL) takes its runs with it: each gets SIGTERM from the kernel (`child_setup`).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import train
from train.sweep.book import Job

log = logging.getLogger("train.sweep")

__all__ = ["POLL_S", "STOP_WAIT_S", "run_local", "train_argv", "train_env"]

POLL_S = 0.1  # how often the driver looks for runs that ended
PR_SET_PDEATHSIG = 1  # prctl option: the signal a child gets when its parent dies
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
STOP_WAIT_S = 60.0  # after Ctrl-C, how long a run gets to save its snapshot before it is killed
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

Started = Callable[[Job], None]
Ended = Callable[[Job, "int | None", "float | None"], None]


def train_argv(data: str, middle: list[str], out: str) -> list[str]:
    """`python -m train` with the point's flags; no progress bar (the console goes to a file)."""
    return [sys.executable, "-m", "train", "--data", data, *middle, "--out", out, "--no-progress"]


def train_env(code: str | None = None) -> dict[str, str]:
    """This environment with one thread per run and our packages importable from any folder
    (from `code`, a PYTHONPATH, when given: a Ray worker's)."""
    env = dict(os.environ, **{name: "1" for name in THREAD_VARS})
    code = code or str(Path(train.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (code, env.get("PYTHONPATH")) if p)
    return env


def child_setup(parent: int) -> Callable[[], None]:
    """Popen's preexec_fn for a run. The run hears SIGINT and SIGTERM whatever its starter blocked:
    a Ray worker blocks SIGINT, a signal mask is inherited, and its runs then never heard the cancel
    and trained on. On Linux the run also gets SIGTERM when its driver dies, however it dies
    (SIGKILL included), so no run trains on unseen; SIGTERM makes the trainer save and exit 143."""
    prctl = None
    if sys.platform.startswith("linux"):
        try:
            prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            prctl = None

    def setup() -> None:  # runs in the child between fork and exec
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
            if os.getppid() != parent:  # the driver died before the line above: do not start at all
                os._exit(1)
    return setup


def launch(command: list[str], log_path: Path, cwd: str | None = None, code: str | None = None) -> subprocess.Popen:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log_file:  # the child keeps its own descriptor
        return subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=train_env(code), cwd=cwd, start_new_session=True,
                                preexec_fn=child_setup(os.getpid()))


def stop(proc: subprocess.Popen, deadline: float) -> int:
    """Wait for a run sent SIGINT until `deadline` (a second Ctrl-C or the deadline: SIGKILL)."""
    try:
        return proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        proc.kill()
        return proc.wait()


def run_local(jobs: list[Job], data: str, argv: Callable[[Job], list[str]], workers: int,
              started: Started, ended: Ended) -> None:
    """Train `jobs`, `workers` at a time; `started`/`ended` are told as each starts and ends. On
    Ctrl-C the live runs are stopped (and reported ended) before KeyboardInterrupt goes on."""
    waiting = list(jobs)
    live: dict[str, tuple[Job, subprocess.Popen, float]] = {}
    try:
        while waiting or live:
            while waiting and len(live) < workers:
                job = waiting.pop(0)
                proc = launch(train_argv(data, argv(job), str(job.out)), job.log)
                live[job.name] = (job, proc, time.monotonic())
                started(job)
            time.sleep(POLL_S)
            for name, (job, proc, t0) in list(live.items()):
                if proc.poll() is not None:
                    del live[name]
                    ended(job, proc.returncode, time.monotonic() - t0)
    except KeyboardInterrupt:
        deadline = time.monotonic() + STOP_WAIT_S
        for job, proc, t0 in live.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for job, proc, t0 in live.values():
            ended(job, stop(proc, deadline), time.monotonic() - t0)
        raise
