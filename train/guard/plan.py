"""A rescue decided and not yet carried out (`train.guard`): its record, the state to restore, the
rate to set, and the one line that says it.

The record (the `rescue` key of that step's metrics.jsonl record; the doctor and the bench read it):
{"kind": "data_spike" | "rate_blowup" | "stall" | "data_shift", "action": "skip" | "rewind" |
"stop" | "none" | "lift" | "refuse" (bad batches whose updates the loop refused: `Monitor.check`)
(watch mode: "watch: would skip" ...), "why": one sentence of the
evidence, "trigger": the same (older readers), "trouble_began": step, "number": n,
"restored_step": step | None, "skipped": batches undone, "skipped_steps": [the bad batches' steps]
(a data spike), "lr_cap": the cap in force after it | None, "factor": the cap over the rate the
schedule asks now | None, "rate_from": what evidence set the rate}.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from train.guard.snapshot import HostSnapshot

__all__ = ["KINDS", "Plan", "record", "rescue_line"]

KINDS = ("data_spike", "rate_blowup", "stall", "data_shift")


@dataclass
class Plan:
    """What the guard will do at `step` (`GuardedRun.act` carries it out)."""

    step: int
    record: dict[str, Any]  # what metrics.jsonl's record of `step` holds under "rescue"
    slot: HostSnapshot | None  # the state to restore (a skip, a rewind, a stop)
    cap: float | None  # the first group's new cap (a rewind, a lift); None: no change, or none left
    began: int  # the step the trouble began
    target: float | None = None  # the level before the trouble (a rewind: what the run must head back to)
    unsafe: float | None = None  # the rate a rewind learns is too high (the cap never lifts past half of it)


def record(kind: str, action: str, why: str, began: int, number: int, slot: HostSnapshot | None, step: int,
           cap: float | None = None, factor: float | None = None, rate_from: str = "",
           skipped_steps: list[int] | None = None) -> dict[str, Any]:
    restored = None if slot is None or action in ("none", "lift") else slot.step
    return {"kind": kind, "action": action, "why": why, "trigger": why, "trouble_began": began, "number": number,
            "restored_step": restored, "skipped": 0 if restored is None or action == "stop" else step - restored,
            "skipped_steps": list(skipped_steps or []), "lr_cap": cap, "factor": factor, "rate_from": rate_from}


def rescue_line(step: int, rec: dict[str, Any]) -> str:
    """The one stderr line of a record (a rescue, a stop, a shift noted, a cap lifted, or what a
    watching guard would do)."""
    action = rec["action"].removeprefix("watch: would ")
    where = f"restored step {rec['restored_step']}" if rec.get("restored_step") is not None else "no snapshot held"
    if action == "skip":
        what = f"{where} ({rec['skipped']} batches skipped, the rate kept)"
    elif action == "refuse":
        what = (f"their {len(rec['skipped_steps'])} update(s) refused before they were taken: nothing undone, "
                "the rate kept")
    elif action == "rewind":
        what = (f"{where} ({rec['skipped']} batches skipped), learning rate capped at {rec['lr_cap']:.3g} "
                f"(x{rec['factor']:.3g} now; {rec['rate_from']})")
    elif action == "lift":
        what = "the rate cap is gone" if rec["lr_cap"] is None else f"the rate cap raised to {rec['lr_cap']:.3g}"
    elif action == "none":
        what = "nothing to do"
    elif rec.get("restored_step") is None:
        what = "no snapshot held to go back to: the run stops"
    else:
        what = f"{where}; the run stops (rescue {rec['number']}: past the guard's max_rescues or its rate floor)"
    verb = {"skip": "skipped", "rewind": "rescued", "lift": "lifted", "none": "noted", "stop": "stopped",
            "refuse": "refused"}[action]
    if rec["action"].startswith("watch"):
        verb = f"would have {verb}" if action != "none" else "noted"
    began = f" (trouble began at step {rec['trouble_began']})" if action not in ("lift",) else ""
    return f"guard: {verb} at step {step}, {rec['kind']}: {rec['why']}{began}; {what}"
