"""What the run doctor reads off each logged record: the first non-finite value of a run, and the
series that grow before a failure (loss, gradient norm, update ratio, residual rms, attention and
output logits, attention entropy), each with the step it first left its starting regime."""

from __future__ import annotations

import bisect
import math
import statistics
from typing import Any

from probes.doctor.read_mirror import GroupReport
from probes.doctor.rescues import rewound
from probes.doctor.run_history import RunHistory, as_float, is_finite
from probes.doctor.thresholds import DoctorThresholds
from probes.doctor.update_scale import adjusted_table
from probes.timeline import uniform_series_entropy
from probes.update_parts.report import UpdateReport, layout_groups_of

__all__ = ["first_nonfinite", "growth_signals", "layer_values", "max_group_log10_u", "max_value",
           "skipped_steps", "update_report"]

Signal = tuple[int, str, str]  # (step, what grew, by how much)
NESTED = frozenset({"attn_entropy", "resid_rms", "attn_logit_max", "gwu", "diverged"})  # what nonfinite_in opens


def layer_values(raw: Any) -> dict[str, list[float]]:
    """A logged {layer: value or [per head]} as {layer: [floats]} (NaN for null); {} if malformed."""
    if not isinstance(raw, dict):
        return {}
    out = {}
    for layer, value in raw.items():
        values = value if isinstance(value, list) else [value]
        out[str(layer)] = [as_float(v) for v in values]
    return out


def max_value(raw: Any) -> float:
    """The largest finite value of a {layer: value or [per head]} record field (NaN if none)."""
    if not isinstance(raw, dict):  # not logged (every foreign log's records): as layer_values reads it
        return math.nan
    values = [v for vs in layer_values(raw).values() for v in vs if math.isfinite(v)]
    return max(values) if values else math.nan


def update_report(h: RunHistory, record: dict[str, Any]) -> UpdateReport | GroupReport | None:
    """The record's g/w/u table as an UpdateReport (built once per record: several rules read it),
    each parameter's u on makemore's scale for its own optimizer (probes.doctor.update_scale); a
    record read from the Monitor's mirror has the groups' medians alone (already on that scale)."""
    table = record.get("gwu")
    if not isinstance(table, dict) or not table:
        groups = record.get("u_groups")
        return GroupReport(record["step"], groups) if isinstance(groups, dict) and groups else None
    key = ("gwu", record["step"])
    if key not in h.cache:
        h.cache[key] = UpdateReport.from_table(adjusted_table(h.info, table), step=record["step"],
                                               layout_groups=layout_groups_of(h.info))
    return h.cache[key]


def later_half_medians(reports: list[UpdateReport]) -> dict[str, float]:
    """Each group's median log10 u over the later half of `reports` (past the first steps'
    transients): what the update-ratio rule judges, and when the divergence rule's warning began."""
    window = reports[len(reports) // 2:]
    if not window:
        return {}
    return {g: statistics.median(vs) for g in window[-1].groups
            if (vs := [r.groups[g]["median_log10_u"] for r in window
                       if g in r.groups and r.groups[g]["median_log10_u"] is not None])}


def first_later_half_above(reports: list[UpdateReport], limit: float) -> int | None:
    """The step of the first report i at which a group of `later_half_medians(reports[:i + 1])` is
    above `limit`: the update-ratio rule's warning had the run been cut there. Each group's later
    half is kept as a sorted window that grows at its end and drops from its start, so the whole
    run costs O(n log n) instead of a median of half the run at every record (4 s at 5000)."""
    windows: dict[str, list[float]] = {}

    def values(report: UpdateReport) -> list[tuple[str, float]]:
        return [(g, v) for g, info in report.groups.items() if (v := info["median_log10_u"]) is not None]

    start = 0
    for i, report in enumerate(reports):
        for g, v in values(report):
            bisect.insort(windows.setdefault(g, []), v)
        for old in reports[start:(i + 1) // 2]:  # the later half of reports[:i + 1] starts at (i + 1) // 2
            for g, v in values(old):
                window = windows[g]
                del window[bisect.bisect_left(window, v)]
        start = (i + 1) // 2
        if any(sorted_median(windows[g]) > limit for g in report.groups if windows.get(g)):
            return report.step
    return None


def sorted_median(values: list[float]) -> float:
    """statistics.median of an already sorted list."""
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def max_group_log10_u(h: RunHistory, record: dict[str, Any]) -> float:
    """The largest group median log10(u) of a record's g/w/u table (NaN if none)."""
    report = update_report(h, record)
    medians = [g["median_log10_u"] for g in report.groups.values()
               if g["median_log10_u"] is not None] if report else []
    return max(medians) if medians else math.nan


def nonfinite_in(record: dict[str, Any]) -> list[str]:
    """What in one record is NaN/inf (logged as null): losses, grad norm, entropies, parameters."""
    bad = [key.replace("_", " ") for key in ("train_loss", "val_loss", "grad_norm")
           if key in record and not is_finite(record[key])]
    if NESTED.isdisjoint(record):  # a record of scalars (every foreign log's): nothing more to look in
        return bad
    for name, label in (("attn_entropy", "attention entropy"), ("resid_rms", "residual rms"),
                        ("attn_logit_max", "max attention logit")):
        layers = [l for l, vs in layer_values(record.get(name)).items() if not all(map(math.isfinite, vs))]
        if layers:
            bad.append(f"{label} of layer{'s' if len(layers) > 1 else ''} {', '.join(layers)}")
    table = record.get("gwu") if isinstance(record.get("gwu"), dict) else {}
    params = [n for n, row in table.items() if isinstance(row, dict) and not is_finite(row.get("w"))]
    if params:
        shown = ", ".join(params[:3]) + (f" and {len(params) - 3} more" if len(params) > 3 else "")
        bad.append(f"parameters {shown}")
    if not bad and isinstance(record.get("diverged"), dict):
        bad.append(str(record["diverged"].get("reason", "training reported a divergence")))
    return bad


def first_nonfinite(h: RunHistory) -> tuple[int, list[str]] | None:
    """(step, what) of the first record holding a non-finite value, or None (found once per history).
    A skipped step (`skipped_steps`) is not one: the loss scaler skipped it and the run went on; nor
    is a step the guard rewound (`probes.doctor.rescues`): the run went on from an earlier state."""
    if "first_nonfinite" not in h.cache:
        skipped = set(skipped_steps(h))
        h.cache["first_nonfinite"] = next(((r["step"], bad) for r in h.records if r["step"] not in skipped
                                           and not rewound(r) and (bad := nonfinite_in(r))), None)
    return h.cache["first_nonfinite"]


def skipped_steps(h: RunHistory) -> list[int]:
    """Steps whose only non-finite value is the gradient norm while a later record logs a finite
    one: a mixed-precision loss scaler skipped the update (GradScaler's inf/NaN gradients), the
    weights were untouched and the run went on. A norm that stays non-finite to the end is not."""
    if "skipped_steps" not in h.cache:
        last_finite = max((r["step"] for r in h.records if is_finite(r.get("grad_norm"))), default=None)
        h.cache["skipped_steps"] = [r["step"] for r in h.records
                                    if last_finite is not None and r["step"] < last_finite
                                    and nonfinite_in(r) == ["grad norm"]]
    return h.cache["skipped_steps"]


def growth_signals(h: RunHistory, t: DoctorThresholds, before: int | None = None) -> list[Signal]:
    """Each series' first step (before `before`) at which it left its starting regime: a loss a
    nat above its start, a quantity ten-fold its first value, a head's entropy collapsed, a group's
    update ratio above the warning line. Sorted by step: the first is the earliest warning."""
    records = [r for r in h.records if before is None or r["step"] < before]
    found: list[Signal] = []
    for key in ("val_loss", "train_loss"):
        series = [(r["step"], as_float(r[key])) for r in records if is_finite(r.get(key))]
        if series:
            start = series[0][1]
            hit = next(((s, v) for s, v in series if v - start >= t.loss_rise), None)
            if hit:
                found.append((hit[0], key.replace("_", " "), f"+{hit[1] - start:.2f} nats"))
    scalar = lambda key: (lambda r: as_float(r.get(key)))  # noqa: E731
    for label, value, floor in (("gradient norm", scalar("grad_norm"), 0.0),
                                ("max |output logit|", scalar("logit_max"), t.growth_floor),
                                ("residual rms", lambda r: max_value(r.get("resid_rms")), t.growth_floor),
                                ("max attention logit", lambda r: max_value(r.get("attn_logit_max")), t.growth_floor)):
        hit = ten_fold(records, value, t.growth_orders, floor)
        if hit:
            found.append((hit[0], label, f"{hit[1]:.0f}x"))
    found += entropy_collapse_signal(h, records, t)
    # past the run's first update, as the update-ratio rule judges (rules_updates.after_first_update)
    reports = [report for r in records if r["step"] != h.first_step and (report := update_report(h, r)) is not None]
    u_hit = first_later_half_above(reports, t.u_high)
    if u_hit is not None:  # where the update-ratio rule, cut there, warns: not one noisy record
        found.append((u_hit, "update ratio", f"a group's median log10 u above {t.u_high} over the later half"))
    return sorted(found, key=lambda s: s[0])


def ten_fold(records: list[dict[str, Any]], value: Any, orders: float, floor: float = 0.0) -> tuple[int, float] | None:
    """(step, growth) where value(record) first reached 10**orders times its first positive value,
    or times `floor` where that is larger (a scale the quantity reaches by learning: thresholds.growth_floor)."""
    series = [(r["step"], v) for r in records if math.isfinite(v := value(r))]
    base = next((v for _, v in series if v > 0), None)
    if base is None:
        return None
    base = max(base, floor)
    return next(((s, v / base) for s, v in series if v >= base * 10 ** orders), None)


def entropy_collapse_signal(h: RunHistory, records: list[dict[str, Any]], t: DoctorThresholds) -> list[Signal]:
    n_ctx = h.model.get("n_ctx")
    if not isinstance(n_ctx, int) or n_ctx < 2:
        return []
    floor = t.collapse_fraction * uniform_series_entropy(n_ctx)
    for r in records:
        layers = [l for l, vs in layer_values(r.get("attn_entropy")).items()
                  if any(math.isfinite(v) and v < floor for v in vs)]
        if layers and r["step"] > records[0]["step"]:  # collapsed at init is the attention rule's
            return [(r["step"], "attention entropy", f"collapsed in layer {', '.join(layers)}")]
    return []
