"""The run doctor's rules on update ratios: each parameter group's u = |update| / |weight| against
makemore's band (too high, too low, frozen), and the series' slow Q/K under SGD (the attention's
queries and keys moving orders of magnitude slower than the block's MLP). Same contract as
`probes.doctor.rules_loss`."""

from __future__ import annotations

import re
import statistics
from typing import Any

from probes.doctor.finding import MAKEMORE_UPDATES, SERIES_ADAM, Finding, rule
from probes.doctor.rules_internals import before_nonfinite
from probes.doctor.run_history import RunHistory
from probes.doctor.signals import later_half_medians, update_report
from probes.doctor.thresholds import DoctorThresholds
from probes.doctor.update_scale import optimizer_evidence
from probes.timeline import stayed_from
from probes.update_parts.report import TARGET_BAND, UpdateReport

__all__ = ["update_ratios"]


BLOCK = re.compile(r"^(?:[A-Za-z_]\w*\.)+?(\d+)\.")
MIN_WINDOW = 3  # logged g/w/u steps in the later half before the Q/K gap is judged


@rule("update_ratio_high", "update_ratio_low", "slow_qk")
def update_ratios(h: RunHistory, t: DoctorThresholds) -> list[Finding]:
    reports = [report for r in before_nonfinite(h) if (report := update_report(h, r)) is not None]
    if not reports:
        raise h.not_logged("g/w/u update ratios", "no g/w/u table in metrics.jsonl")
    reports = after_first_update(h, reports)
    if not reports:
        return []  # the run's first update alone: nothing to judge yet
    window = reports[len(reports) // 2:]  # the later half: past the first steps' transients
    medians = later_half_medians(reports)
    findings = [f for f in (ratio_high(reports, medians, t), ratio_low(reports, window, medians, t)) if f]
    for f in findings:  # say whose scale each group was judged on, where it is not makemore's alone
        f.evidence.update(optimizer_evidence(h.info, [n for g in f.where for n in reports[-1].groups.get(g, {})
                                                        .get("parameters", [])]))
    gap = slow_qk(h, reports, window, t)
    return findings + ([gap] if gap else [])


def after_first_update(h: RunHistory, reports: list[Any]) -> list[Any]:
    """The reports past the run's first logged step: Adam's first update is lr * sign(g) whatever
    the gradient (its moments hold one step), u = lr / w, an order above its steady value; with it
    in the later half, a run cut early (the live doctor at eval_every=10) was warned of that alone."""
    return [r for r in reports if r.step != h.first_step]


def stayed_beyond(reports: list[UpdateReport], group: str, beyond: Any) -> int:
    flags = [beyond(r.groups[group]["median_log10_u"]) if group in r.groups
             and r.groups[group]["median_log10_u"] is not None else False for r in reports]
    start = stayed_from([r.step for r in reports], flags)
    return start if start is not None else next(r.step for r, f in zip(reports, flags) if f)


def ratio_high(reports: list[UpdateReport], medians: dict[str, float], t: DoctorThresholds) -> Finding | None:
    high = {g: m for g, m in medians.items() if m > TARGET_BAND[1]}
    if not high:
        return None
    worst = max(high, key=high.get)
    step = stayed_beyond(reports, worst, lambda v: v > TARGET_BAND[1])
    return Finding(
        "update_ratio_high", "warning" if high[worst] > t.u_high else "info",
        f"{', '.join(high)} update{'s' if len(high) == 1 else ''} too fast: median log10 u "
        f"{high[worst]:+.2f} ({worst}), above the band's {TARGET_BAND[1]:g}", step=step,
        where=tuple(high), evidence={f"log10_u {g}": m for g, m in high.items()},
        cause="each step moves these weights by more than a hundredth of their size: the learning "
              "rate is too high for them",
        fix="lower the learning rate (or that group's), or add warmup", reference=MAKEMORE_UPDATES,
        page="dynamics")


def ratio_low(reports: list[UpdateReport], window: list[UpdateReport], medians: dict[str, float],
              t: DoctorThresholds) -> Finding | None:
    low = {g: m for g, m in medians.items() if m < TARGET_BAND[0]}
    # not the run's first update: a weight that starts at zero (nanochat's c_proj) stops the
    # gradient of every weight before it then, which therefore do not move at that one step
    judged = [r for r in window if r.step != reports[0].step]
    frozen = sorted({n for r in judged for n in r.parameters}
                    - {n for r in judged for n, row in r.parameters.items() if row["u"] != 0})
    if not low and not frozen:
        return None
    severe = frozen or any(m < t.u_low for m in low.values())
    step = stayed_beyond(reports, min(low, key=low.get), lambda v: v < TARGET_BAND[0]) if low else window[0].step
    names = list(low) + ([f"{len(frozen)} frozen parameters"] if frozen else [])
    return Finding(
        "update_ratio_low", "warning" if severe else "info",
        f"{', '.join(names)} barely move: " + (", ".join(f"median log10 u {m:+.2f} ({g})" for g, m in low.items())
                                              or "u = 0 at every logged step"), step=step,
        where=tuple(low) + tuple(frozen[:5]),
        evidence={**{f"log10_u {g}": m for g, m in low.items()}, "frozen": len(frozen)},
        cause="each step moves these weights by less than a ten-thousandth of their size, so they "
              "hardly train" + (" (u = 0: they do not move at all)" if frozen else ""),
        fix="raise the learning rate (or that group's); check that frozen parameters get a gradient",
        reference=MAKEMORE_UPDATES, page="dynamics")


def block_name(report: UpdateReport, block: int) -> str:
    """Block `block` as the model names it (`blocks.3`, `transformer.h.3`, `layers.3`), from its parameters."""
    for name in report.parameters:
        match = BLOCK.match(name)
        if match and int(match.group(1)) == block:
            return name[:match.end() - 1]
    return f"block {block}"


def block_gaps(report: UpdateReport) -> dict[int, tuple[float, float]]:
    """{block: (Q/K median log10 u, MLP median log10 u)} for the blocks that have both."""
    logs: dict[tuple[int, str], list[float]] = {}
    for name, row in report.parameters.items():
        match = BLOCK.match(name)
        group = report.group_of[name]
        if match and row["log10_u"] is not None and group in ("attention Q/K", "MLP"):
            logs.setdefault((int(match.group(1)), group), []).append(row["log10_u"])
    return {b: (statistics.median(logs[b, "attention Q/K"]), statistics.median(logs[b, "MLP"]))
            for b, g in logs if g == "MLP" and (b, "attention Q/K") in logs}


def slow_qk(h: RunHistory, reports: list[UpdateReport], window: list[UpdateReport],
            t: DoctorThresholds) -> Finding | None:
    if len(window) < MIN_WINDOW:
        return None  # a gap over one or two steps says more about the first steps than the optimizer
    per_step = [block_gaps(r) for r in window]
    blocks = sorted(set().union(*per_step)) if per_step else []
    gaps = {b: statistics.median([g[b][1] - g[b][0] for g in per_step if b in g]) for b in blocks}
    mlp_moves = {b: statistics.median([g[b][1] for g in per_step if b in g]) >= TARGET_BAND[0] for b in blocks}
    slow = {b: gap for b, gap in gaps.items() if gap >= t.slow_qk_orders and mlp_moves[b]}
    if not slow:
        return None
    worst = max(slow, key=slow.get)
    optimizer = h.train_config("optimizer")
    qk, mlp = (statistics.median([g[worst][i] for g in per_step if worst in g]) for i in (0, 1))
    sgd = optimizer in ("sgd", None)
    return Finding(
        "slow_qk", "warning", f"block {worst}'s attention Q/K moves {slow[worst]:.2f} orders of magnitude "
        f"slower than its MLP" + (f" under {optimizer.upper()}" if optimizer else ""),
        step=window[0].step, where=tuple(f"{block_name(window[0], b)} Q/K" for b in slow),
        evidence={"gap_orders": slow[worst], "qk_log10_u": qk, "mlp_log10_u": mlp,
                  "optimizer": optimizer or "not logged", **{f"gap block {b}": g for b, g in slow.items()}},
        cause="SGD moves each weight in proportion to its gradient, and the Q/K gradients are far "
              "smaller than the MLP's: attention learns last" if sgd else
              "the Q/K gradients are far smaller than the MLP's, so attention learns last",
        fix="use Adam (--optimizer adam --lr 1e-3): its per-parameter steps close the gap (the "
            "series: about one order under SGD, 0.3 under Adam)" if sgd else
            "raise the attention's learning rate or check the Q/K init",
        reference=SERIES_ADAM, page="dynamics")


# ------------------------------------------------------------------ activation health
