"""A CLI whose reader stops early (`python -m probes.diagnose ... | head -1`) stops quietly with exit
code 0: the reader had what it wanted, and nothing went wrong that a user could act on (issue 38,
item 10: it exited 1 with no word)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("argv", [["probes.diagnose", "--ckpt", "checkpoints/transformer4_nan"],
                                  ["probes.sweep", "--ckpt", "checkpoints/sweep_qk_norm"]],
                         ids=["diagnose", "sweep"])
def test_a_reader_that_stops_after_one_line_gets_exit_0_and_no_noise(argv):
    read, write = os.pipe()
    os.close(read)  # the reader is gone before a word is written: every write meets a closed pipe
    try:
        proc = subprocess.run([sys.executable, "-m", *argv], cwd=REPO, stdout=write, stderr=subprocess.PIPE,
                              env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    finally:
        os.close(write)
    assert proc.returncode == 0 and proc.stderr == b"", proc.stderr


def test_a_full_reader_still_gets_everything():
    out = subprocess.run([sys.executable, "-m", "probes.sweep", "--ckpt", "checkpoints/sweep_qk_norm"], cwd=REPO,
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), check=True)
    assert out.stdout.count("\n") > 10 and out.stderr == ""
