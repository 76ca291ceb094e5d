"""Stopping the app (issue 38, item 8): SIGTERM or Ctrl-C ends `streamlit run app/main.py` at once,
with the shell's code (143, 130) and no "Aborted!", ten times in a row, with pages open and being
drawn; and the deadline in app/stop.py ends a process whose graceful shutdown never comes, even
one whose interpreter lock is held by a long C call."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest

from app.stop import BACKSTOP_S
from browser_kit import REPO, chromium, free_port, _healthy

HANG = BACKSTOP_S + 8  # a wait this long only fails on a server that did not stop


def child(body: str) -> subprocess.Popen:
    """A Python process that installs a do-nothing 'graceful' handler (a server whose shutdown never
    finishes), wraps it with_deadline, says 'ready', then runs `body`."""
    code = textwrap.dedent(f"""
        import signal, sys, time
        sys.path.insert(0, {str(REPO)!r})
        from app.stop import with_deadline
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *a: None)
        with_deadline()
        print("ready", flush=True)
    """) + textwrap.dedent(body)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_a_shutdown_that_never_finishes_meets_the_deadline(sig, code):
    proc = child("while True:\n    time.sleep(0.01)\n")
    proc.send_signal(sig)
    assert proc.wait(timeout=HANG) == code


def test_a_process_whose_lock_is_held_in_c_is_ended_by_the_kernels_alarm():
    # once the signal is handled, a C loop takes the interpreter lock for minutes: the deadline's
    # timer thread cannot run, so only the kernel's alarm can end it
    proc = child("import app.stop\nwhile not app.stop._armed.is_set():\n    time.sleep(0.01)\nsum(range(10 ** 12))\n")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=HANG) == -signal.SIGALRM


@pytest.mark.browser
@pytest.mark.slow
def test_ten_stops_in_a_row_each_at_once_and_quiet(tmp_path):
    stops = [(signal.SIGTERM, 143), (signal.SIGINT, 130)] * 5
    pages = ["attention", "compare", "", "lens", "dynamics"]
    with chromium() as browser:
        for i, (sig, code) in enumerate(stops):
            port = free_port()
            log = tmp_path / f"server{i}.log"
            with open(log, "w") as out:
                proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app/main.py",
                                         "--server.headless", "true", "--server.port", str(port),
                                         "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false"],
                                        cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 120
            while not _healthy(url):
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.05)
            page = browser.new_page()
            page.goto(f"{url}/{pages[i % len(pages)]}?run=shakespeare_gpt", wait_until="commit", timeout=120_000)
            time.sleep(0.3 * (i % 4))  # the stop comes while the page is being drawn, or after
            proc.send_signal(sig)
            assert proc.wait(timeout=HANG) == code, log.read_text()[-2000:]
            page.close()
            said = log.read_text()
            assert "Aborted!" not in said and "Traceback" not in said, said[-2000:]

