"""The guard: the one place that acts on a run (docs/guard.md). A user needs two names from here:

    from train.guard import Guard, GuardStop     # the settings; how a stopped script ends (exit 3)

The parts, one idea each: `settings` (the fields of Guard, checked when made), `stop` (GuardStop,
exit 3), `loss_watch` (the loss judged against the run's own level), `snapshot` (a state held in
host memory), `run` (the guard at work on one model and optimizer: judging, the rate around the
optimizer's step, acting), `evidence` (what a rescue's plan reads of it: `planning`, `rates`),
`loop` (our trainer's `--guard`) and `monitor` (the Monitor's `guard=`, plugged in through
`train.monitor.plugins`; the guard never imports the Monitor).
"""

from __future__ import annotations

from typing import Any

from train.guard.settings import Settings
from train.guard.stop import EXIT_STOPPED, GuardStop

__all__ = ["EXIT_STOPPED", "Guard", "GuardStop"]


class Guard(Settings):
    """The guard's settings (`train.guard.settings.Settings`: every field, checked when made), and
    `attach`, the guard at work without a Monitor. Here rather than in `settings` so that the
    settings stay below the run that reads them (no import circle), and torch stays unloaded until
    a guard is attached."""

    def attach(self, model: Any, optimizer: Any, start_step: int = 0) -> Any:
        """A guard on this model and optimizer without a Monitor (a DDP rank other than 0):
        `run.log(step, train_loss=...)` judges and acts as `Monitor.log` does; `run.close()` unhooks.
        `start_step`: the step number of the first update (as the Monitor's)."""
        from train.guard.run import GuardedRun
        from train.values import first_optimizer
        return GuardedRun(self, model, first_optimizer(optimizer), start_step)
