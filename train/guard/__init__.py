"""The guard: the one place that acts on a run (docs/guard.md). A user needs two names from here:

    from train.guard import Guard, GuardStop     # the settings; how a stopped script ends (exit 3)

The parts, one idea each: `settings` (Guard, checked when made), `stop` (GuardStop, exit 3),
`loss_watch` (the loss judged against the run's own level), `snapshot` (a state held in host
memory), `run` (the guard at work on one model and optimizer: judging, the rate around the
optimizer's step, acting), `loop` (our trainer's `--guard`) and `monitor` (the Monitor's `guard=`).
"""

from train.guard.settings import Guard
from train.guard.stop import EXIT_STOPPED, GuardStop

__all__ = ["EXIT_STOPPED", "Guard", "GuardStop"]
