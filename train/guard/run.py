"""The guard at work on one model and optimizer: it keeps a few calm states in host memory, judges
each loss (`loss_watch`), tells the kind of trouble (`kinds`) and acts on it:

- a data spike: the state from just before the bad batches is restored and the run goes on with
  its next batch, at its own rate (their updates are undone: OLMo-core's skip-step, PaLM's skip);
- a rate blow-up: the run goes back to a calm state before the damage began, with its rate capped
  at one its own evidence says is stable (the rate at which its update ratios were last in their
  band, or the rate at the last calm step cut), ramped back up over `rewarm` steps;
- a data shift: noted once, nothing done;
- a stall after a rewind (the loss flat far above its level before the trouble): an earlier state
  and a lower rate again; past `max_rescues` or the rate floor, a clean stop.
Once a rescued run is back at its level and calm, a cap is doubled every `lift_after` steps until
it is gone (never back to half the rate that blew up).

    with Monitor(model, optimizer, "runs/x", guard=True) as monitor:      # or guard=Guard(...)
        for step in range(steps):
            ...; loss.backward(); optimizer.step(); scheduler.step()
            monitor.log(step, train_loss=loss.item())                        # the guard acts in here

A healthy run is untouched: the snapshots only copy, the rate is never written, no random number
is drawn. The decision reads numbers already on the host (the logged loss; the gradient norm and
update ratios the Monitor measures at its log steps; with eval tokens, each head's attention
entropy the Monitor reads every 25 steps: a head gone one-hot fast is a rate blow-up, `attention`).
Under torchrun every rank holds a guard and the loss is averaged over the ranks at each check, so
every rank decides alike.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import torch

from train.guard.attention import Readings
from train.guard.kinds import (RATIO_LINE, Excursion, bad_block, classify, falling, growth, own_noise, rate_rose,
                               ratios_say, stalled)
from train.guard.loss_watch import LossWatch
from train.guard.plan import Plan, record, rescue_line
from train.guard.planning import rate_plan, skip_plan
from train.guard.rate import RateCap, rate_of
from train.guard.ranks import everyone
from train.guard.rates import lift_plan
from train.guard.snapshot import HostSnapshot
from train.guard.stop import EXIT_STOPPED, GuardStop
from train.guard.update_probe import UpdateProbe

if TYPE_CHECKING:
    from train.guard.settings import Settings

log = logging.getLogger("train.guard")

CREEP = 1.0  # nats a level may creep above the lowest the run had before it is a blow-up that never spiked

__all__ = ["GuardedRun"]


@dataclass
class Recovery:
    """After a rewind: the level the run must head back to, and its losses since."""

    since: int
    target: float | None
    losses: list[float] = field(default_factory=list)


class GuardedRun:
    """A guard at work on one model and optimizer (hooked on the optimizer's step for the rate)."""

    def __init__(self, settings: Settings, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 start_step: int | None = 0):
        s = self.settings = settings
        self.model, self.optimizer, self.scaler = model, optimizer, s.scaler
        self.watch = LossWatch(window=s.window, sigma=s.sigma, min_rise=s.min_rise)
        self.slots = [HostSnapshot() for _ in range(s.keep)]
        self.rate = RateCap(optimizer, s.rewarm)
        self.probe = UpdateProbe(optimizer)  # the next update's ratio, when an episode waits on it
        self.rescues: list[dict[str, Any]] = []  # every record, with its "step"
        self.undone = 0  # updates undone by skips and rewinds (their batches are not replayed)
        self.stopped = False
        self.rates: deque = deque(maxlen=s.window)  # (step, the rate its update applied), raw
        self.ratios: deque = deque(maxlen=64)  # (step, median update ratio, its update's rate, calm)
        self.norms: deque = deque(maxlen=64)  # (step, gradient norm, calm)
        self.attention = Readings()  # each head's attention entropy, read by the Monitor every 25 steps
        self.recovery: Recovery | None = None
        self.best_level: float | None = None  # the lowest level the run had (since its last rewind or shift)
        self.unsafe: float | None = None  # the lowest rate at which a rate blow-up began
        self.first_rate: float | None = None  # the rate when rate trouble first came (the floor's base)
        self.calm_from: int | None = None  # the step since which a capped run has been calm (lifting)
        self.skips: list[tuple[int, list[int]]] = []  # data-spike skips: (step, the bad batches' steps)
        self.refused: set[int] = set()  # steps whose update the loop refused on the guard's word (`refuse`)
        self.acts = 0  # rewinds (rate blow-ups and stalls)
        self.last_restored: HostSnapshot | None = None  # kept until the run proved calm after it
        self.quiet = False  # watch mode: an episode said, its consequences not said again
        self._kept: int | None = start_step  # the step of the last snapshot by the cadence
        if start_step is not None:  # the state before the first update: where a blow-up at the start goes back
            self.slots[0].take(start_step - 1, model, optimizer, self.scaler, [g["lr"] for g in optimizer.param_groups])

    @property
    def handles(self) -> list[Any]:
        return self.rate.handles + self.probe.handles

    @property
    def ceilings(self) -> list[float | None]:
        return self.rate.ceilings

    # ------------------------------------------------------------------ reading

    def log(self, step: int, train_loss: Any = None, grad_norm: Any = None, **_ignored: Any) -> dict[str, Any] | None:
        """`Monitor.log`'s part for a rank without a Monitor: the same reads, the same decision."""
        record_ = self.check(step, *self.read(step, train_loss, grad_norm))
        if record_ is not None and record_["action"] == "stop":
            raise GuardStop(EXIT_STOPPED)
        return record_

    def read(self, step: int, loss: Any, grad_norm: Any, due: bool | None = None) -> tuple[float | None, float | None]:
        """The logged loss and gradient norm as floats; a tensor only when `due` (a device sync: the
        Monitor's log steps, else every `read_every` steps)."""
        from train.values import number  # a bad value refused in the Monitor's words
        due = step % self.settings.read_every == 0 if due is None else due
        values = []
        for name, value in (("train_loss", loss), ("grad_norm", grad_norm)):
            if isinstance(value, torch.Tensor) and not due:
                value = None  # read at the next due step: no device sync here
            value = number(name, value)
            values.append(None if value is None else float(value))
        return values[0], values[1]

    def check(self, step: int, loss: float | None, grad_norm: float | None = None,
              ratio: float | None = None) -> dict[str, Any] | None:
        """Judge `step` and act: the record of what was done, or None (then a snapshot when due)."""
        plan = self.observe(step, *everyone(self.model, loss, grad_norm, ratio))
        if plan is None:
            self.keep(step)
            return None
        return self.act(plan)

    def refuse(self, step: int, loss: float | None) -> bool:
        """Whether to refuse `step`'s update before it is taken (OLMo-core's skip-step; the loop asks
        before `optimizer.step()`, `Monitor.check`): its loss above the spike line of a run that has a
        level, fewer than `hold` - 1 refused in a row before it (a loss that stays high is no bad batch:
        a shift or the rate, judged when logged). A non-finite loss is left to the rewind. Every rank
        decides alike; a watching guard only says it."""
        loss = everyone(self.model, loss, None)[0]
        row = 0
        while step - 1 - row in self.refused:
            row += 1
        w = self.watch
        if loss is None or not math.isfinite(loss) or self.stopped or not w.judged() or row >= self.settings.hold - 1:
            return False
        line = w.lines()[0]
        if loss <= line:
            return False
        said = f"the loss {loss:.3f} is above the spike line {line:.3f}"
        if self.settings.mode == "watch":
            log.warning("guard: would have refused the update of step %d: %s", step, said)
            return False
        self.refused.add(step)
        log.info("guard: refused the update of step %d: %s", step, said)
        return True

    def attention_due(self, step: int) -> bool:
        """Whether the Monitor is to read the attention now (`Readings.see` takes it)."""
        return not self.stopped and not self.quiet and self.attention.due(step)

    # ------------------------------------------------------------------ judging

    def observe(self, step: int, loss: float | None, grad_norm: float | None = None, ratio: float | None = None,
                collapse: int | None = None, warned: Callable[[int], tuple[int, str] | None] | None = None,
                now: int | None = None) -> Plan | None:
        """Take `step`'s numbers; the plan when something is to be done (or said), else None.
        `collapse`: the step of the last attention reading before a fast collapse (`attention.see`);
        `warned(began)`: the doctor's early warning before `began`, asked only when trouble is judged;
        `now`: the step the plan is carried out at (our loop judges a few steps at once)."""
        if self.stopped:
            return None
        now = step if now is None else now
        self.rates.append((step, self.rate.applied))
        if loss is None:
            if grad_norm is not None and not math.isfinite(grad_norm) and not self.quiet:
                return rate_plan(self, "rate_blowup", "the gradient norm is not finite", step, now, warned)
            return None
        open_before = list(self.watch.excursion)
        began_before = self.watch.trouble_began() if open_before else None
        spike = self.watch.see(step, loss)
        probed = self.probe.take()  # the guard's own reading of this step's update, when it asked for one
        self._measured(step, grad_norm, ratio if ratio is not None else probed, calm=not spike and not open_before)
        if self.quiet:  # watch mode: the trouble said, its consequences not said again until calm
            self.quiet = spike
            return None
        if spike and not math.isfinite(loss):
            return rate_plan(self, "rate_blowup", f"the loss is {loss}", step, now, warned)
        if spike or open_before:
            spikes = self.watch.excursion if spike else open_before
            began = self.watch.trouble_began() if spike else began_before
            return self._judge_excursion(spikes, not spike, began, step, now, warned)
        if collapse is not None and not self._sharpening(collapse, step):  # gone one-hot fast, the loss stuck: the rate
            why = self.attention.why or f"a head's attention collapsed after step {collapse}"
            return rate_plan(self, "rate_blowup", why, step, now, warned, began=collapse + 1, newest=collapse)
        if self.recovery is not None:
            return self._judge_recovery(step, loss, now)
        return self._judge_creep(step, now, warned) or lift_plan(self, step, now)

    def _sharpening(self, spread: int, step: int) -> bool:
        """A head collapsed fast since the reading at `spread` while the loss kept falling and the update
        ratios stayed under the growth line: a phase change the model learns by (a head taking its job),
        not the rate's trouble (healthy heads lost up to 0.54 of uniform's entropy in 25 steps).
        Where the reading before was the untrained model's (`attention.first_at`), every run's loss
        falls from its initial level at first and nothing calm came before to set a line: the loss
        alone decides, still falling over the second half of the span by its own noise (a Llama-style
        GPT at its best rate, 10x ours, sharpens its first head by step 25 while its loss falls from 60
        to 4 with update ratios at 0.06; ours at 100x sits flat at 3.4 from step 12)."""
        losses = [v for s, v in self.watch._losses if s > spread]
        if spread == self.attention.first_at:
            half = losses[len(losses) // 2:]
            if not falling(half, own_noise(half)):
                return False
        elif any(u > RATIO_LINE for s, u, *_ in self.ratios if s > spread) \
                or not falling(losses, self.watch.noise()):
            return False
        log.info("guard: step %d: %s, the loss falling: a phase change, left alone", step, self.attention.why)
        return True

    def _measured(self, step: int, grad_norm: float | None, ratio: float | None, calm: bool) -> None:
        if grad_norm is not None:
            self.norms.append((step, grad_norm, calm))
        if ratio is not None and math.isfinite(ratio):
            self.ratios.append((step, ratio, self.rate.applied, calm))

    def _judge_excursion(self, spikes: list, closed: bool, began: int, step: int, now: int,
                         warned: Callable | None) -> Plan | None:
        s, w = self.settings, self.watch
        apart = sum(1 for k, _ in self.skips if step - s.window < k < began - s.hold)  # each after calm
        ex = Excursion(losses=tuple(v for _, v in spikes), closed=closed, level=w.level() or w.first or 0.0,
                       noise=w.noise(), first=w.first, growth=growth(self.ratios, self.norms, began, s.read_every),
                       recent_skips=apart, after=self.watch.last[1] if closed else None, early=not w.judged())
        verdict = classify(ex, s.patience, s.hold)
        if verdict is None:
            return None
        kind, why = verdict
        if kind == "data_shift" and not closed:  # the rate or the data?
            rose = rate_rose([(k, rate_of(r)) for k, r in self.rates if r is not None], began, 2 * s.read_every)
            if rose is not None:
                kind, why = "rate_blowup", f"{why.split(':')[0]}: {rose}"
            elif not ratios_say(self.ratios, began) and step - began < s.hold + 4:
                self.probe.arm()  # the next update's ratio says: wait a step
                return None
        bad = [st for st, _ in spikes]
        if kind == "data_spike" and not closed:  # the bad block, then the loss down at once
            bad = bad[:bad_block(ex.losses, ex.level, s.patience)]
        if kind == "data_spike" and self.skips and began - self.skips[-1][0] <= s.hold:  # right after a skip
            bad = self.skips[-1][1] + bad
            if len(bad) >= s.hold:  # bad batches that do not end: the data changed
                why = f"{why}; {len(bad)} bad batches right after one another: the data changed"
                return Plan(now, record("data_shift", "none", why, bad[0], self.acts, None, now, cap=self.rate.cap,
                                        rate_from="the rate kept"), None, None, bad[0])
        if kind == "data_spike":  # refused before they were taken (`refuse`): nothing to undo
            return skip_plan(self, why, began, bad, now, refused=set(bad) <= self.refused)
        if kind == "data_shift":
            if self.recovery is not None:  # a new level after a rewind that the run does not leave: a stall
                return rate_plan(self, "stall", why.replace("a new level", "a stall after the rescue"), step, now, None)
            return Plan(now, record(kind, self._said("none"), why, began, self.acts, None, now,
                                    cap=self.rate.cap, rate_from="the rate kept"), None, None, began)
        return rate_plan(self, kind, why, step, now, warned, began)

    def _judge_creep(self, step: int, now: int, warned: Callable | None) -> Plan | None:
        """A level crept a nat above the lowest level the run had, with no spike and not coming down
        over the last `hold` steps: the rate (a blow-up that never spiked)."""
        w, s = self.watch, self.settings
        level = w.level() if w.judged() else None
        if level is None:
            return None
        self.best_level = level if self.best_level is None else min(self.best_level, level)
        recent = [v for _, v in list(w._losses)[-s.hold:]]
        if level - self.best_level < CREEP or falling(recent, w.noise()):
            return None
        why = f"the loss crept up to a level of {level:.3f}, {level - self.best_level:.2f} nats above its lowest " \
              f"level {self.best_level:.3f}, without a spike"
        return rate_plan(self, "rate_blowup", why, step, now, warned)

    def _judge_recovery(self, step: int, loss: float, now: int) -> Plan | None:
        """After a rewind: back near the level before the trouble (recovered), a stall, or wait."""
        s, rec = self.settings, self.recovery
        rec.losses.append(loss)
        if len(rec.losses) < s.stall_window:
            return None
        gap = max(0.5, 6 * self.watch.noise())
        tail = rec.losses[-s.stall_window:]
        if rec.target is None or statistics.fmean(tail[-len(tail) // 4:]) <= rec.target + gap:
            self.recovery, self.calm_from, self.last_restored = None, step, None
            return None
        if stalled(tail, rec.target, gap, self.watch.noise()):
            why = (f"the loss stayed near {statistics.fmean(tail[-len(tail) // 4:]):.3f} for {s.stall_window} steps "
                   f"after the rescue, {gap:.2f}+ nats above its level {rec.target:.3f} before the trouble")
            return rate_plan(self, "stall", why, step, now, None, began=rec.since)
        rec.losses = rec.losses[-s.stall_window:]
        return None

    # ------------------------------------------------------------------ planning

    def _said(self, action: str) -> str:
        return f"watch: would {action}" if self.settings.mode == "watch" and action != "none" else action

    def _held(self) -> list[HostSnapshot]:
        return [slot for slot in self.slots if slot.step is not None]

    # ------------------------------------------------------------------ snapshots

    def keep(self, step: int) -> None:
        """A snapshot of the state now (that of `step`), if `every` steps passed since the last, the
        step is calm and the run is not still heading back after a rewind."""
        if self._kept is not None and step - self._kept < self.settings.every:
            return
        if not self.watch.calm(step) or self.recovery is not None or self.quiet:
            return
        held = self._held()
        slot = next((x for x in self.slots if x.step is None), None)
        if slot is None:
            spare = [x for x in held if x is not self.last_restored]
            slot = min(spare, key=lambda x: x.step)
        slot.take(step, self.model, self.optimizer, self.scaler, lrs=list(self.rate.asked))
        self._kept = step

    @property
    def held_since(self) -> int | None:
        """The step of the oldest snapshot held (how far back a rewind can reach)."""
        return min((x.step for x in self._held()), default=None)

    @property
    def snapshot_bytes(self) -> int:
        return sum(x.nbytes for x in self.slots)

    # ------------------------------------------------------------------ acting

    def act(self, plan: Plan) -> dict[str, Any]:
        """Carry the plan out (a watching guard only says it); log its line; return its record."""
        rec, slot = plan.record, plan.slot
        action = rec["action"]
        self.rescues.append({"step": plan.step, **rec})
        log.warning("%s", rescue_line(plan.step, rec))
        if action.startswith("watch"):
            self.stopped = action.endswith("stop")
            self.quiet = action.endswith(("skip", "rewind"))
            if rec["kind"] == "data_spike":
                self.watch.restart(plan.step, plan.began)
            return rec
        if action == "none":
            if rec["kind"] == "data_shift":
                self.watch.accept(plan.step)
                self.best_level = None  # a new level: measured from here
            return rec
        if action == "lift":
            self.rate.lift(plan.cap)
            return rec
        if action == "refuse":  # the bad updates were never taken: nothing restored, the run goes on
            self.skips.append((plan.step, rec["skipped_steps"]))
            self.watch.restart(plan.step, plan.began)
            return rec
        if slot is not None:
            slot.restore(self.model, self.optimizer, self.scaler)
            self.undone += rec["skipped"]
            for other in self.slots:  # states taken after the trouble began are not kept
                if other is not slot and other.step is not None and other.step >= slot.step \
                        and other.step >= plan.began - 1:
                    other.step = None
            self.attention.restored(slot.step, plan.step)
        if action == "stop":
            self.stopped = True
            return rec
        self.last_restored = slot
        self._kept = plan.step  # the next snapshot `every` steps from now
        if action == "skip":
            self.skips.append((plan.step, rec["skipped_steps"]))
            self.watch.restart(plan.step, plan.began)
            return rec
        self.acts += 1
        if plan.unsafe is not None:
            self.unsafe = plan.unsafe if self.unsafe is None else min(self.unsafe, plan.unsafe)
        self.rate.set(plan.cap, ramp=True)
        self.watch.restart(plan.step, keep_before=-math.inf)
        self.recovery, self.calm_from, self.best_level = Recovery(plan.step, plan.target), None, None
        return rec

    def close(self) -> None:
        self.rate.close()
        self.probe.close()

    def __enter__(self) -> GuardedRun:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
