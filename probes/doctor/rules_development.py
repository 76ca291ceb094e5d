"""The run doctor's reading of a run's development (`probes.development`): a head's attention entropy
collapsing, or a sink forming, between snapshots, joined to what the loss did meanwhile. Torch-free:
it reads the development readings cached beside the run's snapshots (`development.json`, written by
`python -m probes.development` or the app's Development page) and finds nothing where there are none
(a run nobody read that way is not "not checked": the readings are optional, like the first view).

A collapse that comes with a head taking a role at the same snapshot (an induction or previous-token
head forming: Olsson et al. 2022's phase change, whose entropy falls as it learns where to look) is
a note; a collapse with the loss bumping over the same window and no role gained is a warning.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from probes.doctor.finding import ZHAI, Finding, rule
from probes.doctor.run_history import RunHistory
from probes.doctor.thresholds import DoctorThresholds
from probes.phase_changes import phase_changes

__all__ = ["development_readings", "head_phases"]

log = logging.getLogger(__name__)

OLSSON = "Olsson et al. 2022, In-context Learning and Induction Heads (the induction-head phase change)"
XIAO = "Xiao et al. 2023, Efficient Streaming Language Models with Attention Sinks"
ROLES = ("induction_heads", "previous_token_heads", "duplicate_heads")


def development_readings(run_dir: Path, upto: int | None = None) -> list[dict[str, Any]]:
    """The readings cached beside the run's snapshots (step order, cut at `upto`); a damaged one is left
    out with a warning."""
    if not run_dir.is_dir():
        return []
    found = []
    for path in [*run_dir.glob("step_*/development.json"), *run_dir.glob("*.development.json")]:
        try:
            reading = json.loads(path.read_text())["reading"]
            if isinstance(reading.get("step"), int) and (upto is None or reading["step"] <= upto):
                found.append(reading)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            log.warning("%s: not a development reading (%s); left out", path, err)
    return sorted(found, key=lambda r: r["step"])


def loss_series(h: RunHistory) -> list[tuple[int, float]]:
    for key in ("train_loss", "val_loss"):
        series = [(s, v) for s, v in h.series(key) if math.isfinite(v)]
        if series:
            return series
    return []


@rule("head_entropy_collapse", "sink_forming")
def head_phases(h: RunHistory, t: DoctorThresholds) -> list[Finding]:
    readings = [] if h.path is None else development_readings(Path(h.path), h.upto)
    if len(readings) < 3 or len({json.dumps([len(r) for r in x["entropy"]]) for x in readings}) > 1:
        return []
    grids = {"entropy": [r["entropy"] for r in readings], "sink": [r["scores"]["sink"] for r in readings]}
    grids.update({name: [r["scores"][name] for r in readings] for name in ("previous_token", "duplicate_token")})
    grids["induction"] = [r["scores"].get("induction_repeat") or r["scores"]["induction"] for r in readings]
    changes = phase_changes([r["step"] for r in readings], grids, loss_curve=loss_series(h),
                            repeat_loss=[r.get("repeat_loss") for r in readings])
    roles = {(c["step"], tuple(head)) for c in changes if c["kind"] in ROLES for head in c["heads"]}  # (step, head)
    found = []
    for c in changes:
        if c["kind"] == "entropy_collapse":
            found.append(collapse_finding(c, roles))
        elif c["kind"] == "sink_heads":
            found.append(sink_finding(c))
    return found


def names(heads: list[list[int]]) -> tuple[str, ...]:
    return tuple(f"L{layer}H{head}" for layer, head in heads)


def loss_words(loss: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """What the training loss did over the change's window, in words and numbers."""
    if not loss:
        return "", {}
    numbers = {"loss_before": loss["before"], "loss_after": loss["after"], "loss_bump": loss["bump"]}
    if loss["bump"] > 0:
        return f", with a loss bump of {loss['bump']:.3g}", numbers
    if loss["plateau_end"]:
        return ", ending a loss plateau", numbers
    return "", numbers


def window(c: dict[str, Any]) -> dict[str, Any]:
    ev = c["evidence"]
    lead = max(ev["per_head"], key=lambda p: abs(p["after"] - p["before"]))
    return {"from_step": ev["from_step"], "to_step": ev["to_step"], "heads": len(c["heads"]),
            "before": lead["before"], "after": lead["after"]}


def collapse_finding(c: dict[str, Any], roles: set[tuple[int, tuple[int, ...]]]) -> Finding:
    """A collapse; a head that took a role within the collapse's window makes it a note."""
    heads, ev = names(c["heads"]), c["evidence"]
    with_role = [h for h in c["heads"] if any(ev["from_step"] <= s <= ev["to_step"] and head == tuple(h)
                                              for s, head in roles)]
    words, numbers = loss_words(c["evidence"].get("loss"))
    severity = "warning" if numbers.get("loss_bump", 0) > 0 and not with_role else "info"
    role = " as they took a role (an induction or previous-token head formed there)" if with_role else ""
    return Finding(
        "head_entropy_collapse", severity,
        f"{len(heads)} head{'s' if len(heads) > 1 else ''}' attention entropy fell sharply between snapshots "
        f"({', '.join(heads)}){role}{words}", step=c["step"], where=heads,
        evidence={**window(c), **numbers, "with_a_role": len(with_role)},
        cause="the heads' attention went from spread to concentrated within a few snapshots: healthy when they "
              "learn where to look (a phase change), a sign of instability when the loss bumps and no role forms",
        fix="" if severity == "info" else
        "a lower learning rate or QK-norm, if the heads stay collapsed (see Attention)",
        reference=f"{OLSSON}; {ZHAI}", page="development")


def sink_finding(c: dict[str, Any]) -> Finding:
    heads = names(c["heads"])
    words, numbers = loss_words(c["evidence"].get("loss"))
    return Finding(
        "sink_forming", "info", f"an attention sink formed in {', '.join(heads)}{words}", step=c["step"], where=heads,
        evidence={**window(c), **numbers},
        cause="the heads moved most of their attention onto the first position within a few snapshots: a "
              "place to put attention that has nowhere useful to go",
        fix="", reference=XIAO, page="development")
