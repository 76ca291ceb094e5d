"""Shared pytest fixtures.

Works with an editable install (``pip install -e ".[dev]"``) or from the checkout with
``PYTHONPATH=.``. Nothing heavy is imported at collection time.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
TINY_SHAKESPEARE = REPO_ROOT / "data" / "tinyshakespeare.txt"


@pytest.fixture(scope="session", autouse=True)
def _torch_threads() -> None:
    """One intra-op thread: the test models are tiny, so threads only add overhead, and on a
    shared 2-core machine OpenMP spin-waits made each op take milliseconds. (Benchmarks, not
    tests, measure threaded speed.)"""
    try:
        import torch
    except ImportError:  # torch-free tests (e.g. packaging) still run
        return
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def shakespeare() -> Path:
    """``data/tinyshakespeare.txt``, shipped with the repository: its absence is a failure."""
    assert TINY_SHAKESPEARE.is_file(), f"{TINY_SHAKESPEARE} is missing: it ships with the repository"
    return TINY_SHAKESPEARE


@pytest.fixture
def seed() -> int:
    """Seed torch's global RNG deterministically; returns the seed used."""
    import torch

    value = 0
    torch.manual_seed(value)
    return value


@pytest.fixture
def no_hang():
    """A FIFO opened for reading blocks until a writer comes: fail the test instead of hanging."""
    def stop(*_):
        raise TimeoutError("blocked reading a FIFO")
    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)
