"""The arms of benchmarks/bench_guard.py: what watches a run of benchmarks/guard_cases.py, each a
watcher called around the optimizer's step of one plain loop (forward, backward, step, schedule):

- none: nothing watches the run;
- palm: PaLM's manual recipe made automatic (Chowdhery et al. 2022, section 5.1: restart about 100
  steps before a spike and skip the batches in between): on a spike, restore the snapshot taken
  about 100 steps before, keep the rate (snapshots every 50 steps, 3 held, and the state at the
  start; at most 20 rewinds). The spike: two losses in a row more than 6 noise units and 0.3 nats
  above the mean of the last 16 (the noise: the spread of consecutive differences over 128 steps),
  or a non-finite loss;
- skip: OLMo-core's SkipStepOptimizer rule: the update is skipped when the loss or the gradient
  norm lies more than 6 standard deviations from its mean over the last 128 steps (judged once 64
  are held);
- lightning: Lightning's SpikeDetection rule (its defaults): past a warmup of 1 batch, a loss that
  is non-finite, or that is no better than the last one and at least rtol=2 times the running mean
  of the last 10 losses above that mean, is a spike, and the run stops (Lightning raises and
  leaves the batches to skip on a restart to the user);
- guard: our guard at its defaults (or the `options` given), as users run it:
  `Monitor(..., guard=Guard(...))` and `monitor.log(step, train_loss=loss)` (`via="attach"` in the
  options: `Guard.attach`, as a rank without a Monitor runs it);
- guard_loss: the guard with a Monitor given no eval tokens (the loss and the update ratios alone);
- guard_check: the guard arm plus `monitor.check(loss, step)` before each `optimizer.step()`, which
  refuses one bad batch's update instead of skipping back to a snapshot.
"""

from __future__ import annotations

import copy
import math
import statistics
from collections import deque
from typing import Any

from guard_cases import Outcome, val_windows

EVAL_ROWS = 8  # eval tokens the Monitor measures the internals on (and the guard the attention): 8 val windows


def eval_tokens() -> Any:
    """[EVAL_ROWS BLOCK] held-out windows (never trained on), as a user gives the Monitor `eval_tokens`."""
    return val_windows()[0][:EVAL_ROWS]

ARMS = ("none", "palm", "skip", "lightning", "guard", "guard_loss", "guard_check")
PALM_BACK, PALM_EVERY, PALM_KEEP, PALM_MAX = 100, 50, 3, 20


class Bare:
    """The none arm: every update is taken, nothing is watched."""

    def __init__(self, model: Any, optimizer: Any, options: dict[str, Any]):
        self.model, self.optimizer = model, optimizer

    def before_step(self, step: int, loss: float) -> bool:
        """Whether to take this step's update."""
        return True

    def after_step(self, step: int, loss: float) -> bool:
        """Whether the run stops here."""
        return False

    def report(self, out: Outcome) -> None:
        pass


class SkipStep(Bare):
    """OLMo-core's rule: skip the update when the loss or gradient norm is > 6 sigma off its mean."""

    def __init__(self, model: Any, optimizer: Any, options: dict[str, Any]):
        super().__init__(model, optimizer, options)
        self.losses: deque = deque(maxlen=128)
        self.norms: deque = deque(maxlen=128)
        self.skips = 0

    def before_step(self, step: int, loss: float) -> bool:
        import torch
        norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), math.inf))
        finite = math.isfinite(loss) and math.isfinite(norm)  # a NaN or inf step is skipped, never kept in
        take = finite and (len(self.losses) < 64 or (self.calm(self.losses, loss) and self.calm(self.norms, norm)))
        if finite:  # the history the next steps are judged against: only numbers (pstdev fails on NaN)
            self.losses.append(loss)
            self.norms.append(norm)
        self.skips += not take
        return take

    @staticmethod
    def calm(past: deque, value: float) -> bool:
        mean, std = statistics.fmean(past), statistics.pstdev(past)
        z = abs(value - mean) / std if std > 0 else (0.0 if value == mean else math.inf)
        return z <= 6.0

    def report(self, out: Outcome) -> None:
        out.rescues = out.lost = self.skips


class Spikes:
    """PaLM's detector: two losses in a row 6 noise units and 0.3 nats above the mean of the last 16."""

    def __init__(self):
        self.losses: deque = deque(maxlen=128)
        self.run = 0

    def see(self, loss: float) -> bool:
        if not math.isfinite(loss):
            return True
        recent = list(self.losses)[-16:]
        diffs = [b - a for a, b in zip(self.losses, list(self.losses)[1:])]
        noise = statistics.pstdev(diffs) if len(diffs) > 1 else math.inf
        high = len(recent) >= 16 and loss > statistics.fmean(recent) + max(6 * noise, 0.3)
        self.run = self.run + 1 if high else 0
        if not high:
            self.losses.append(loss)
        return self.run >= 2

    def calm(self) -> bool:
        return self.run == 0

    def restart(self) -> None:
        self.losses.clear()
        self.run = 0


class PaLM(Bare):
    """Rewind ~100 steps on a spike, skip the batches in between, keep the rate."""

    def __init__(self, model: Any, optimizer: Any, options: dict[str, Any]):
        super().__init__(model, optimizer, options)
        self.spikes = Spikes()
        self.held: list[tuple[int, Any]] = [(-1, self.state())]  # (step, state); the start where an early blow-up goes
        self.kept, self.rewinds, self.undone = -1, 0, 0

    def state(self) -> Any:
        return copy.deepcopy((self.model.state_dict(), self.optimizer.state_dict()))

    def after_step(self, step: int, loss: float) -> bool:
        spike = self.spikes.see(loss) if self.rewinds < PALM_MAX else False
        if not spike:
            if step - self.kept >= PALM_EVERY and self.spikes.calm():
                self.held = (self.held + [(step, self.state())])[-PALM_KEEP:]
                self.kept = step
            return False
        back = [h for h in self.held if h[0] <= step - PALM_BACK]
        at, (weights, opt_state) = back[-1] if back else self.held[0]
        self.model.load_state_dict(weights)
        lrs = [g["lr"] for g in self.optimizer.param_groups]
        self.optimizer.load_state_dict(opt_state)
        for g, lr in zip(self.optimizer.param_groups, lrs):  # the schedule goes on where it is: PaLM keeps the rate
            g["lr"] = lr
        self.rewinds += 1
        self.undone += step - at
        self.held = [h for h in self.held if h[0] <= at]
        self.spikes.restart()
        return False

    def report(self, out: Outcome) -> None:
        out.rescues, out.lost = self.rewinds, self.undone
        out.snapshot_bytes = sum(_nbytes(s) for _, s in self.held)


class Lightning(Bare):
    """Lightning's SpikeDetection at its defaults (window 10, warmup 1, rtol 2, atol None): it stops."""

    def __init__(self, model: Any, optimizer: Any, options: dict[str, Any]):
        super().__init__(model, optimizer, options)
        self.detector = SpikeRule(**options)

    def after_step(self, step: int, loss: float) -> bool:
        return self.detector.spike(step, loss)

    def report(self, out: Outcome) -> None:
        out.stopped = self.detector.stopped


class SpikeRule:
    """The rule of Lightning's SpikeDetection, in our words: a running mean of the last `window`
    finite losses; from batch `warmup` on, a loss is a spike when it is non-finite, or when it did
    not improve on the last loss and lies at least `atol` (when given) and `rtol` times the mean
    above the mean."""

    def __init__(self, window: int = 10, warmup: int = 1, rtol: float | None = 2.0, atol: float | None = None):
        self.recent: deque = deque(maxlen=window)
        self.warmup, self.rtol, self.atol = warmup, rtol, atol
        self.last = 0.0
        self.stopped = False

    def spike(self, batch: int, loss: float) -> bool:
        if batch >= self.warmup and self.recent and self._is_spike(loss):
            self.stopped = True
            return True
        if math.isfinite(loss):
            self.recent.append(loss)
            self.last = loss
        return False

    def _is_spike(self, loss: float) -> bool:
        if not math.isfinite(loss):
            return True
        if loss - self.last <= 0:
            return False
        mean = statistics.fmean(self.recent)
        return (self.atol is None or abs(loss - mean) >= abs(self.atol)) and \
            (self.rtol is None or abs(loss - mean) >= abs(self.rtol * mean))


class Guarded(Bare):
    """The guard as users run it: `Monitor(model, optimizer, out, guard=Guard(...))` and
    `monitor.log(step, train_loss=loss)` (the Monitor measures the update ratios and gradient norm
    the guard reads, every 10 steps), in a temporary run directory; with options' `via="attach"`,
    as a rank without a Monitor runs it (`Guard.attach`, the loss alone). `monitor=False` in the
    options: the Monitor alone, no guard (the cost's baseline)."""

    def __init__(self, model: Any, optimizer: Any, options: dict[str, Any]):
        import tempfile

        from train.guard import Guard
        from train.monitor import Monitor
        super().__init__(model, optimizer, options)
        options = dict(options)
        via, guarded, with_eval = options.pop("via", "monitor"), options.pop("guard", True), options.pop("eval", True)
        tokens = options.pop("tokens", None)  # the case's own eval rows (a model of another vocabulary)
        self.tmp, self.error = None, ""
        if via == "attach":
            self.run, self.monitor = Guard(**options).attach(model, optimizer), None
        else:
            self.tmp = tempfile.TemporaryDirectory()
            self.monitor = Monitor(model, optimizer, f"{self.tmp.name}/run", report=False,
                                   eval_tokens=(eval_tokens() if tokens is None else tokens) if with_eval else None,
                                   guard=Guard(**options) if guarded else False)
            self.run = self.monitor.guard

    def after_step(self, step: int, loss: float) -> bool:
        from train.guard import GuardStop
        try:
            (self.monitor or self.run).log(step, train_loss=loss)
        except GuardStop:
            return True
        except Exception as err:  # a guard that fails ends its run, and the table says so (no table lost)
            self.error = f"step {step}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            return True
        return False

    def report(self, out: Outcome) -> None:
        out.error = self.error
        if self.run is not None:
            report_rescues(self.run.rescues, out)
            out.snapshot_bytes = getattr(self.run, "snapshot_bytes", 0)
            self.run.close()
        if self.monitor is not None:
            self.monitor.close()
            if out.rescues or out.stopped:
                out.stories = doctor_stories(f"{self.tmp.name}/run")
        if self.tmp is not None:
            self.tmp.cleanup()


class LossOnly(Guarded):
    """The guard with a Monitor given no eval_tokens: the loss, and the update ratios and gradient
    norm at its log steps (no attention readings)."""

    def __init__(self, model: Any, optimizer: Any, options: dict[str, Any]):
        super().__init__(model, optimizer, {**options, "eval": False})


class CheckFirst(Guarded):
    """The guard with `monitor.check(loss, step)` before `optimizer.step()` (OLMo-core's way, as an
    option): a bad batch's update is refused there, nothing to undo later; the rest as the guard arm."""

    def before_step(self, step: int, loss: float) -> bool:
        return self.monitor is None or self.monitor.check(loss, step)


class Monitored(Guarded):
    """The Monitor alone, as the guard arm runs it, without a guard: the baseline of its cost."""

    def __init__(self, model: Any, optimizer: Any, options: dict[str, Any]):
        super().__init__(model, optimizer, {**options, "guard": False})


def report_rescues(records: list[dict[str, Any]], out: Outcome) -> None:
    """The guard's records (the `rescue` entries of metrics.jsonl) counted into `out`: actions that
    changed the run (skip, refuse, rewind), batches lost, a stop, and what it did in order."""
    acted = [r for r in records if str(r.get("action", "")) in ("skip", "refuse", "rewind")]
    out.rescues = len(acted)
    out.lost = sum(int(r.get("skipped") or 0) for r in acted)
    out.stopped = any(r.get("action") == "stop" for r in records)
    out.actions = ",".join(f"{r['kind']}/{r['action']}" if r.get("kind") else str(r.get("action")) for r in records)


def doctor_stories(run_dir: str) -> list[tuple[str, str, str, str]]:
    """What the doctor (`probes.diagnose`) tells of each rescue in the run's folder: (kind, action,
    cause, fix) per `rescued` or `guard_stopped` finding, in order."""
    from probes import diagnose
    found = diagnose.run(run_dir)
    return [(str(f.evidence.get("kind", "")), "stop" if f.code == "guard_stopped" else "acted", f.cause or "",
             f.fix or "") for f in found.findings if f.code in ("rescued", "guard_stopped")]


def _nbytes(tree: Any) -> int:
    import torch
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, dict):
        return sum(_nbytes(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(_nbytes(v) for v in tree)
    return 0


WATCHERS = {"none": Bare, "palm": PaLM, "skip": SkipStep, "lightning": Lightning, "guard": Guarded,
            "guard_loss": LossOnly, "guard_check": CheckFirst, "monitor": Monitored}
