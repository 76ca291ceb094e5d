"""The run doctor's reading of a run's development (`probes.development`): a head's attention entropy
collapsing, or a sink forming, between snapshots, joined to what the loss did meanwhile. Torch-free.

One run, one verdict: it reads only the development readings the run's own records hold (a
metrics.jsonl record's `development`: a `probes.development` snapshot reading, written by whatever
trained the run at that step), never the `development.json` caches that `python -m probes.development`
or the app's Development page leave beside the snapshots: opening a page never changes a verdict.
A run without such records finds nothing here (the readings are optional: not "not checked").

A head's entropy falling sharply (`probes.development_parts.phase_changes`) is a collapse only where it fell to half
its value or less: the head then spreads its attention over no more than about the square root of
the keys it spread it over before (normalised entropy H / ln k halved); a fall from 0.92 to 0.84 is
a head sharpening, as healthy heads do. A collapse that comes with a head taking a role at the same
snapshot (an induction or previous-token head forming: Olsson et al. 2022's phase change, whose
entropy falls as it learns where to look) is a note; one over which the training loss rose (after
minus before, by more than NOISE times the run's own step-to-step loss noise) and no role was
gained is a warning.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from typing import Any

from probes.development_parts.phase_changes import phase_changes
from probes.doctor.finding import ZHAI, Finding, rule
from probes.doctor.run_history import RunHistory
from probes.doctor.thresholds import DoctorThresholds

__all__ = ["development_readings", "head_phases"]

log = logging.getLogger(__name__)

OLSSON = "Olsson et al. 2022, In-context Learning and Induction Heads (the induction-head phase change)"
XIAO = "Xiao et al. 2023, Efficient Streaming Language Models with Attention Sinks"
ROLES = ("induction_heads", "previous_token_heads", "duplicate_heads")


NOISE = 3.0  # a loss rise over a collapse's window counts past this many times the loss's own noise
COLLAPSED = 0.5  # a head's normalised entropy at most this share of its value before: a collapse


def development_readings(h: RunHistory) -> list[dict[str, Any]]:
    """The development readings the run's records hold (step order; the history is cut at --step
    already); a malformed one is left out with a warning. Never the caches beside the snapshots."""
    found = []
    for r in h.records:
        reading = r.get("development")
        if reading is None:
            continue
        if isinstance(reading, dict) and isinstance(reading.get("entropy"), list) \
                and isinstance(reading.get("scores"), dict):
            found.append({**reading, "step": r["step"]})
        else:
            log.warning("%s: the development reading at step %s is malformed; left out", h.path, r["step"])
    return found


def loss_noise(series: list[tuple[int, float]]) -> float:
    """The run's own step-to-step loss noise: the median absolute change between logged losses."""
    changes = [abs(b - a) for (_, a), (_, b) in zip(series, series[1:])]
    return statistics.median(changes) if changes else 0.0


def loss_series(h: RunHistory) -> list[tuple[int, float]]:
    for key in ("train_loss", "val_loss"):
        series = [(s, v) for s, v in h.series(key) if math.isfinite(v)]
        if series:
            return series
    return []


@rule("head_entropy_collapse", "sink_forming")
def head_phases(h: RunHistory, t: DoctorThresholds) -> list[Finding]:
    readings = development_readings(h)
    if len(readings) < 3 or len({json.dumps([len(r) for r in x["entropy"]]) for x in readings}) > 1:
        return []
    grids = {"entropy": [r["entropy"] for r in readings], "sink": [r["scores"]["sink"] for r in readings]}
    grids.update({name: [r["scores"][name] for r in readings] for name in ("previous_token", "duplicate_token")})
    grids["induction"] = [r["scores"].get("induction_repeat") or r["scores"]["induction"] for r in readings]
    curve = loss_series(h)
    changes = phase_changes([r["step"] for r in readings], grids, loss_curve=curve,
                            repeat_loss=[r.get("repeat_loss") for r in readings])
    roles = {(c["step"], tuple(head)) for c in changes if c["kind"] in ROLES for head in c["heads"]}  # (step, head)
    found = []
    for c in changes:
        if c["kind"] == "entropy_collapse" and collapsed(c):
            found.append(collapse_finding(c, roles, NOISE * loss_noise(curve)))
        elif c["kind"] == "sink_heads":
            found.append(sink_finding(c))
    return found


def names(heads: list[list[int]]) -> tuple[str, ...]:
    return tuple(f"L{layer}H{head}" for layer, head in heads)


def collapsed(c: dict[str, Any]) -> bool:
    """A fall of some head's entropy to COLLAPSED of its value or less (not a head sharpening)."""
    return any(p["after"] <= COLLAPSED * p["before"] for p in c["evidence"]["per_head"])


def loss_words(loss: dict[str, Any] | None, noise: float = 0.0) -> tuple[str, dict[str, Any]]:
    """What the training loss did over the change's window, in words and numbers: a bump is a rise
    (the loss after the window minus before it) above `noise`, the run's own."""
    if not loss:
        return "", {}
    rise = loss["after"] - loss["before"]
    numbers = {"loss_before": loss["before"], "loss_after": loss["after"], "loss_bump": max(rise, 0.0),
               "loss_noise": noise}
    if rise > noise:
        return f", with the loss rising by {rise:.3g}", numbers
    if loss["plateau_end"]:
        return ", ending a loss plateau", numbers
    return "", numbers


def window(c: dict[str, Any]) -> dict[str, Any]:
    ev = c["evidence"]
    lead = max(ev["per_head"], key=lambda p: abs(p["after"] - p["before"]))
    return {"from_step": ev["from_step"], "to_step": ev["to_step"], "heads": len(c["heads"]),
            "before": lead["before"], "after": lead["after"]}


def collapse_finding(c: dict[str, Any], roles: set[tuple[int, tuple[int, ...]]], noise: float) -> Finding:
    """A collapse; a head that took a role within the collapse's window makes it a note."""
    heads, ev = names(c["heads"]), c["evidence"]
    with_role = [h for h in c["heads"] if any(ev["from_step"] <= s <= ev["to_step"] and head == tuple(h)
                                              for s, head in roles)]
    words, numbers = loss_words(c["evidence"].get("loss"), noise)
    severity = "warning" if numbers.get("loss_bump", 0) > noise and not with_role else "info"
    role = " as they took a role (an induction or previous-token head formed there)" if with_role else ""
    whose = "heads'" if len(heads) > 1 else "head's"  # 1 head's entropy, 2 heads' entropy
    return Finding(
        "head_entropy_collapse", severity,
        f"{len(heads)} {whose} attention entropy fell sharply between snapshots ({', '.join(heads)}){role}{words}", step=c["step"], where=heads,
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
