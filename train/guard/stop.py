"""How a run the guard stopped ends: `GuardStop` (a SystemExit: no traceback) with exit code 3."""

from __future__ import annotations

__all__ = ["EXIT_STOPPED", "GuardStop"]

EXIT_STOPPED = 3  # as `python -m train` exits when a run diverged


class GuardStop(SystemExit):
    """Raised from `Monitor.log` when the guard stops a run: the run's records are written, the
    last good state is back in the model (and saved where the store can save it), the diagnosis is
    printed; a script ends with exit code 3 and no traceback."""
