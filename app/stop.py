"""How the app's server stops: at once, every time, and quietly.

`streamlit run` serves an `st.App` with uvicorn, whose first SIGTERM or Ctrl-C asks for a graceful
shutdown that waits for the open sessions and the scripts they run; a script deep in a long
computation (or an import holding the interpreter lock) kept a server serving for seconds or
minutes after its first SIGTERM. Once its shutdown is done, uvicorn raises the signal again to the
handler it found, and Python's default Ctrl-C handler then made click print "Aborted!" and exit 1.

- `quiet_exits()`, while app/main.py is first imported (before uvicorn takes the signals): the
  handlers uvicorn finds, and so calls last, leave with the shell's codes (130, 143) and no word;
- `with_deadline()`, from the server's start-up hook (after uvicorn took them): the first stop
  signal still asks uvicorn for its graceful shutdown, and also arms a deadline: after GRACE_S the
  process leaves whatever it is doing, and should even the interpreter lock be held so long that
  the deadline cannot run, the kernel's alarm ends it BACKSTOP_S after the signal.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

GRACE_S = 1.0  # the graceful shutdown's time; a quiet app stops in ~0.3 s
BACKSTOP_S = 2  # whole seconds (alarm): the kernel ends the process if the deadline could not run
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}

_armed = threading.Event()


def leave(code: int) -> None:
    """Flush what was said, then exit at once (no interpreter teardown to wait for)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def quiet_exits() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for sig, code in EXIT_CODES.items():
        signal.signal(sig, lambda _sig, _frame, code=code: leave(code))


def arm(code: int) -> None:
    """Start the deadline once: a timer thread, and the kernel's alarm behind it."""
    if _armed.is_set():
        return
    _armed.set()
    timer = threading.Timer(GRACE_S, leave, args=(code,))
    timer.daemon = True
    timer.start()
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(BACKSTOP_S)


def with_deadline() -> None:
    """Wrap the stop signals' current handlers (uvicorn's) so that the first one arms the deadline."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig, code in EXIT_CODES.items():
        previous = signal.getsignal(sig)

        def handler(signum: int, frame: Any, previous: Any = previous, code: int = code) -> None:
            arm(code)
            if callable(previous):
                previous(signum, frame)
            else:  # SIG_DFL or SIG_IGN where nothing else stops the server: stop now
                leave(code)

        signal.signal(sig, handler)
