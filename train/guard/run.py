"""The guard: the one place that acts on a run. It keeps a few states of the model and optimizer in
host memory; when the loss turns non-finite or spikes against the run's own recent level (or the
gradient norm turns non-finite), it rewinds to the last state taken before the trouble began,
caps the learning rate, and lets the loop go on (the batches in between are not replayed).
Repeated trouble cuts deeper, then stops the run cleanly, naming the structural fix.

    with Monitor(model, optimizer, "runs/x", guard=True) as monitor:      # or guard=Guard(cut=0.3)
        for step in range(steps):
            ...; loss.backward(); optimizer.step(); scheduler.step()
            monitor.log(step, train_loss=loss.item())                        # the guard acts in here

The rate: a rescue sets a cap on each param group's rate, `cut**k` times the rate the user's
schedule asked for at the restored state (k: the rescue's number). Around the optimizer's own step
(just before it; the user's value is put back just after, so a scheduler, or a loop setting
g["lr"] by hand, stays in charge and sees its own numbers) the rate is scaled by
min(1, cap / the highest rate the schedule asked for since the rescue): while a warmup climbs the
run trains at the cap; once the schedule decays, the run decays with it, in its shape, from the
cap down. A constant rate is simply cut. Groups sharing a schedule keep their ratios. Over the
first `rewarm` steps after a rewind the rate also ramps up from 1/rewarm of that (a warmup again:
the restored optimizer state, fresh at the start, meets other batches and another rate).

A healthy run is untouched: the snapshots only copy, the rate is never written, no random number
is drawn. The decision reads numbers already on the host (the logged loss); a loss logged as a
tensor is read only at the Monitor's log steps (without one, every `read_every` steps). Under
torchrun every rank holds a guard (rank 0 through its Monitor, the others through `Guard.attach`):
the loss is averaged over the ranks at each check (one all-reduce of three numbers), so every rank
decides alike and rewinds alike.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from train.guard.loss_watch import LossWatch
from train.guard.snapshot import HostSnapshot
from train.guard.stop import EXIT_STOPPED, GuardStop

if TYPE_CHECKING:
    from train.guard.settings import Guard

log = logging.getLogger("train.guard")

__all__ = ["GuardedRun", "Plan", "rescue_line"]


class GuardedRun:
    """A guard at work on one model and optimizer (hooked on the optimizer's step for the rate)."""

    def __init__(self, settings: Guard, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 start_step: int | None = 0):
        s = self.settings = settings
        self.model, self.optimizer, self.scaler = model, optimizer, s.scaler
        self.watch = LossWatch(window=s.window, sigma=s.sigma, min_rise=s.min_rise, patience=s.patience)
        self.slots = [HostSnapshot() for _ in range(s.keep)]
        self.ceilings: list[float | None] = []  # per param group; none until a rescue
        self.peaks: list[Any] = []  # per param group: its highest asked rate since the last rescue
        self._since = 0  # optimizer steps since the last rewind (the ramp back up)
        self.rescues: list[dict[str, Any]] = []
        self.asked: list[Any] = []  # each group's rate the user set for the last update (before any cap)
        self.undone = 0  # updates undone by rewinds (their batches are not replayed)
        self.stopped = False
        self._user_lrs: list[Any] | None = None  # the user's rates while the step runs capped
        self.handles = [optimizer.register_step_pre_hook(self._cap), optimizer.register_step_post_hook(self._uncap)]
        self._kept: int | None = start_step  # the step of the last snapshot by the cadence
        if start_step is not None:  # the state before the first update: where a blow-up at the start goes back
            self.slots[0].take(start_step - 1, model, optimizer, self.scaler, [g["lr"] for g in optimizer.param_groups])

    # ------------------------------------------------------------------ the rate, around the step

    def _cap(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Scale each capped group's rate by min(1, cap / the highest rate its schedule asked for
        since the rescue) (a climbing schedule trains at the cap, a falling one keeps its shape),
        and over the first `rewarm` steps after a rewind by a ramp up from 1/rewarm."""
        groups = optimizer.param_groups
        self.asked = [g["lr"] for g in groups]
        if not any(c is not None for c in self.ceilings):
            return
        self._user_lrs = list(self.asked)
        self._since += 1
        ramp = min(1.0, self._since / self.settings.rewarm)
        for i, (g, ceiling) in enumerate(zip(groups, self.ceilings)):
            lr, peak = g["lr"], self.peaks[i]
            if ceiling is None:
                continue
            if isinstance(lr, torch.Tensor):  # no read of a device value: tensors all the way
                self.peaks[i] = lr.detach().clone() if peak is None else torch.maximum(peak, lr)
                g["lr"] = lr * torch.clamp(ceiling / self.peaks[i], max=1.0) * ramp
            else:
                self.peaks[i] = lr if peak is None else max(peak, lr)
                factor = min(1.0, ceiling / self.peaks[i]) * ramp if self.peaks[i] > 0 else ramp
                if factor < 1.0:
                    g["lr"] = lr * factor

    def _uncap(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._user_lrs is not None:
            for g, lr in zip(optimizer.param_groups, self._user_lrs):
                g["lr"] = lr
            self._user_lrs = None

    # ------------------------------------------------------------------ judging

    def log(self, step: int, train_loss: Any = None, grad_norm: Any = None, **_ignored: Any) -> dict[str, Any] | None:
        """`Monitor.log`'s part for a rank without a Monitor: the same reads, the same decision."""
        record = self.check(step, *self.read(step, train_loss, grad_norm))
        if record is not None and record["action"] == "stop":
            raise GuardStop(EXIT_STOPPED)
        return record

    def read(self, step: int, loss: Any, grad_norm: Any, due: bool | None = None) -> tuple[float | None, float | None]:
        """The logged loss and gradient norm as floats; a tensor only when `due` (a device sync: the
        Monitor's log steps, else every `read_every` steps)."""
        from train.monitor_parts import number  # a bad value refused in the Monitor's words
        due = step % self.settings.read_every == 0 if due is None else due
        values = []
        for name, value in (("train_loss", loss), ("grad_norm", grad_norm)):
            if isinstance(value, torch.Tensor) and not due:
                value = None  # read at the next due step: no device sync here
            value = number(name, value)
            values.append(None if value is None else float(value))
        return values[0], values[1]

    def check(self, step: int, loss: float | None, grad_norm: float | None = None) -> dict[str, Any] | None:
        """Judge `step`'s loss (and gradient norm) and act on trouble: the rescue's record, or None.
        Under torchrun the numbers are first averaged over the ranks (every rank calls this)."""
        if self.stopped:
            return None
        why = self.judge(step, *self.everyone(loss, grad_norm))
        if why is None:
            self.keep(step)
            return None
        return self.act(self.plan(step, why))

    def judge(self, step: int, loss: float | None, bad_grad: bool = False) -> str | None:
        """Why `step` is trouble (its loss, or a non-finite gradient norm), or None; the same
        numbers on every rank give the same answer."""
        why = self.watch.see(step, loss) if loss is not None else None
        return why if why is not None or not bad_grad else "the gradient norm is not finite"

    def everyone(self, loss: float | None, grad_norm: float | None) -> tuple[float | None, bool]:
        """(the loss, whether a gradient norm is non-finite), over every rank under torchrun."""
        bad = grad_norm is not None and not math.isfinite(grad_norm)
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return loss, bad
        device = next(self.model.parameters()).device if dist.get_backend() == "nccl" else torch.device("cpu")
        t = torch.tensor([0.0 if loss is None else loss, float(loss is not None), float(bad)],
                         dtype=torch.float64, device=device)
        dist.all_reduce(t)
        total, given, bads = t.tolist()
        world = dist.get_world_size()
        return (total / world if given == world else None), bads > 0

    def keep(self, step: int) -> None:
        """A snapshot of the state now (that of `step`), if `every` steps passed since the last and
        the loss is calm."""
        if self._kept is not None and step - self._kept < self.settings.every or not self.watch.calm(step):
            return
        held = [s for s in self.slots if s.step is not None]
        slot = next((s for s in self.slots if s.step is None), None) or min(held, key=lambda s: s.step)
        slot.take(step, self.model, self.optimizer, self.scaler, lrs=self.asked)
        self._kept = step

    @property
    def held_since(self) -> int | None:
        """The step of the oldest snapshot held (how far back a rewind can reach)."""
        return min((s.step for s in self.slots if s.step is not None), default=None)

    @property
    def snapshot_bytes(self) -> int:
        return sum(s.nbytes for s in self.slots)

    # ------------------------------------------------------------------ acting

    def plan(self, step: int, why: str, warned: tuple[int, str] | None = None) -> Plan:
        """What to do for trouble seen at `step`, nothing done yet: which state to restore (the
        newest taken before the trouble began, else the oldest held), the new caps, or a stop.
        `warned`: (step, what) of the doctor's early warning, when one came before the loss's
        trouble (an internal grown ten-fold): the trouble began there."""
        began = self.watch.trouble_began()
        if warned is not None and warned[0] < began:
            began = warned[0]
        held = [s for s in self.slots if s.step is not None]
        good = [s for s in held if s.step < began - 1]  # the loss of the step after it was calm
        slot = max(good, key=lambda s: s.step) if good else min(held, key=lambda s: s.step, default=None)
        number = len(self.rescues) + 1
        stop = number > self.settings.max_rescues or slot is None
        record: dict[str, Any] = {"action": "stop" if stop else "rewind", "trigger": why, "trouble_began": began,
                                  "restored_step": None if slot is None else slot.step, "number": number}
        if warned is not None and warned[0] == began:
            record["warned"] = f"{warned[1]} at step {warned[0]}"
        ceilings = None
        if not stop:
            ceilings = self._ceilings(slot, number)
            user = _number(self.optimizer.param_groups[0]["lr"])
            record.update({"lr_cap": ceilings[0], "factor": min(1.0, ceilings[0] / user) if user > 0 else 1.0,
                           "skipped": step - slot.step})
        if self.settings.mode == "watch":
            record["action"] = f"watch: would {record['action']}"
        return Plan(step, record, slot, ceilings, began)

    def _ceilings(self, slot: HostSnapshot, number: int) -> list[float | None]:
        """The caps of rescue `number`: cut**number times the rate each group's schedule asked for
        at the restored state, never above a cap already set."""
        scale = self.settings.cut ** number
        rates = [_number(lr) for lr in slot.lrs] or [_number(g["lr"]) for g in self.optimizer.param_groups]
        old = self.ceilings + [None] * (len(rates) - len(self.ceilings))
        return [scale * r if c is None else min(c, scale * r) for r, c in zip(rates, old)]

    def act(self, plan: Plan) -> dict[str, Any]:
        """Carry the plan out (a watching guard only counts it): restore the state, set the caps,
        drop the snapshots taken after the trouble began; log its line; return its record."""
        record, slot = plan.record, plan.slot
        stop = record["action"].endswith("stop")
        if self.settings.mode == "watch":
            self.stopped = stop
        else:
            if slot is not None:
                slot.restore(self.model, self.optimizer, self.scaler)
                self.undone += record.get("skipped", 0)
            self.stopped = stop
            if not stop:
                self.ceilings, self.peaks, self._since = plan.ceilings, [None] * len(plan.ceilings), 0
                for other in self.slots:  # states taken after the trouble began are not kept
                    if other is not slot and other.step is not None and other.step >= plan.began - 1:
                        other.step = None
        if slot is not None:
            self.watch.rewound(slot.step)
        self.rescues.append({"step": plan.step, **record})
        log.warning("%s", rescue_line(plan.step, record))
        return record

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def __enter__(self) -> GuardedRun:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@dataclass
class Plan:
    """A rescue decided and not yet carried out (`GuardedRun.plan`, then `act`)."""

    step: int
    record: dict[str, Any]  # what metrics.jsonl's record of `step` holds under "rescue"
    slot: HostSnapshot | None  # the state to restore
    ceilings: list[float | None] | None  # the new caps per param group (None: a stop)
    began: int  # the step the trouble began


def _number(lr: Any) -> float:
    return float(lr) if not isinstance(lr, torch.Tensor) else float(lr.detach())


def rescue_line(step: int, record: dict[str, Any]) -> str:
    """The one stderr line of a rescue (or a stop, or what a watching guard would do)."""
    where = f"restored step {record['restored_step']}" if record.get("restored_step") is not None else "no snapshot held"
    if record["action"].endswith("rewind"):
        what = (f"{where} ({record['skipped']} batches skipped), learning rate capped at {record['lr_cap']:.3g} "
                f"(x{record['factor']:.3g} now)")
    elif record.get("restored_step") is None:
        what = "no snapshot held to go back to: the run stops"
    else:
        what = f"{where}; the run stops (trouble {record['number']}, past the guard's max_rescues)"
    verb = "would rescue" if record["action"].startswith("watch") else "rescued" if "rewind" in record["action"] \
        else "stopped"
    return f"guard: {verb} at step {step}: {record['trigger']} (trouble began at step {record['trouble_began']}); {what}"
