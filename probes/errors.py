"""The probes' input error, torch-free so that log readers (the timeline, the run doctor) raise it
without importing torch."""

from __future__ import annotations


class ProbeInputError(ValueError):
    """Bad input to a probe: the message is one line that names the problem."""
