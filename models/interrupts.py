"""Ctrl-C (SIGINT) and SIGTERM (`kill`, a job scheduler, a container stop) in every CLI: one line
on stderr and the shell's exit code (130, 143), whenever they come; never a traceback, never a
half-written snapshot.

Three phases, three handlers (all torch-free; signal handlers run between bytecodes of the main
thread):

- `quiet_signals()`, called first thing by each `python -m X` entry, before its imports: nothing
  has been written yet, so the process says its line and leaves with `os._exit` at once (a
  KeyboardInterrupt raised inside torch's imports would print 20-50 lines of traceback);
- `raising_signals()`, around a CLI's body (`run_cli`): SIGINT raises KeyboardInterrupt and
  SIGTERM raises `Terminated`, so `finally` blocks run (locks released) before the line;
- `deferred_signals()`, around a write that must be whole (`save_snapshot`): the signal waits
  until the write is done, then is delivered to the handler that was there before.

The training loop installs its own handlers that only ask it to stop after the current step.
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

EXIT_INTERRUPTED = 130  # 128 + SIGINT: the shell's code for Ctrl-C
EXIT_TERMINATED = 143  # 128 + SIGTERM
SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_CODE = {signal.SIGINT: EXIT_INTERRUPTED, signal.SIGTERM: EXIT_TERMINATED}
LINE = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}


class Terminated(KeyboardInterrupt):
    """SIGTERM as an exception: handled wherever Ctrl-C is (a KeyboardInterrupt), told apart by
    its type for the exit code."""


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def _handlers(handler: Callable[[int, Any], Any]) -> Iterator[dict[int, Any]]:
    """`handler` for SIGINT and SIGTERM inside; the previous handlers back on the way out."""
    if not _main_thread():  # handlers can only be set from the main thread: leave them be
        yield {}
        return
    old = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    try:
        yield old
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


def quiet_signals() -> None:
    """Until a CLI's body runs: its line, its exit code, nothing else (see the module doc)."""
    def leave(signum: int, _frame: Any) -> None:
        os.write(2, f"{LINE[signum]}\n".encode())
        os._exit(EXIT_CODE[signum])

    if _main_thread():
        for sig in SIGNALS:
            signal.signal(sig, leave)


def _raise(signum: int, _frame: Any) -> None:
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


@contextmanager
def raising_signals() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt, SIGTERM raises Terminated (the CLI's body runs in here)."""
    with _handlers(_raise):
        yield


@contextmanager
def deferred_signals() -> Iterator[None]:
    """SIGINT/SIGTERM held until the block is done, then delivered to the previous handler."""
    seen: list[int] = []
    try:
        with _handlers(lambda signum, _frame: seen.append(signum)):
            yield
    finally:
        for signum in dict.fromkeys(seen):  # each once, in the order they came
            signal.raise_signal(signum)


def exit_line(exc: KeyboardInterrupt) -> tuple[str, int]:
    """The one line and exit code for a KeyboardInterrupt or Terminated that reached a CLI."""
    return signal_exit(signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)


def signal_exit(signum: int | None) -> tuple[str, int]:
    """("interrupted", 130) for SIGINT (or not known), ("terminated", 143) for SIGTERM."""
    sig = signal.SIGTERM if signum == signal.SIGTERM else signal.SIGINT
    return LINE[sig], EXIT_CODE[sig]
