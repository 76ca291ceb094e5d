"""What the app draws from a run's metrics.jsonl, as plain rows: pure functions, no Streamlit.

Every value is the logged one (null, NaN and inf read as NaN, drawn as a gap); the only
derived numbers are tokens per second (tokens between two records over the time those steps
took) and the EMA the charts draw in front of the raw line. Records are taken in step order,
a record redone after a resume replacing the old one (as the run doctor reads them).
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from probes.doctor.run_history import as_float, by_step  # noqa: F401 (by_step re-exported)
from probes.doctor.signals import layer_values

NAN = float("nan")


def scalar(records: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    """(step, value) of every record that logged `key` (NaN where it logged null)."""
    return [(r["step"], as_float(r[key])) for r in by_step(records) if key in r]


def logged(records: list[dict[str, Any]], key: str) -> bool:
    return any(key in r for r in records)


def rows(records: list[dict[str, Any]], curves: dict[str, str], y: str, color: str = "curve") -> list[dict]:
    """Long rows {step, color: name, y: value} for each (name -> metrics key) in `curves`."""
    return [{"step": step, color: name, y: value}
            for name, key in curves.items() for step, value in scalar(records, key)]


def tokens_per_second(records: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(step, tokens/s) for each record after the first: the tokens trained since the previous
    record over the time those steps took, step_time_ms being the mean wall time per step since
    the previous record (evals and saves excluded). NaN where a value is missing or not positive."""
    out = []
    ordered = by_step(records)
    for prev, cur in zip(ordered, ordered[1:]):
        tokens = as_float(cur.get("tokens")) - as_float(prev.get("tokens"))
        seconds = as_float(cur.get("step_time_ms")) / 1000 * (cur["step"] - prev["step"])
        out.append((cur["step"], tokens / seconds if seconds > 0 and tokens >= 0 else NAN))
    return out


def per_layer(records: list[dict[str, Any]], key: str, field: str | None = None) -> list[dict]:
    """Rows {step, layer, head, value} of a per-layer field: `{layer: x}`, `{layer: [per head]}`
    (attn_logit_max, resid_rms, attn_entropy) or, with `field`, `{layer: {field: x}}` (activations'
    dead / saturated). `head` is None for one value per layer."""
    out = []
    for r in by_step(records):
        raw = r.get(key)
        if not isinstance(raw, dict):
            continue
        if field is not None:
            raw = {layer: (v.get(field) if isinstance(v, dict) else None) for layer, v in raw.items()}
        for layer, values in layer_values(raw).items():
            single = not isinstance(raw[layer], list)
            out += [{"step": r["step"], "layer": layer, "head": None if single else h, "value": v}
                    for h, v in enumerate(values)]
    return out


def layer_name(hook: str) -> str:
    """A short legend name for an activation hook, `blocks.0.mlp.hook_post_1` -> 'block 0 post_1',
    or module of a model of one's own, `layers.1.ff.1` -> 'block 1 ff.1' (its first numbered part
    is its block; the rest names it within the block)."""
    parts = hook.split(".")
    if parts[-1].startswith("hook_"):
        name = parts[-1].removeprefix("hook_")
        return f"block {parts[1]} {name}" if len(parts) > 2 and parts[0] == "blocks" else name
    at = next((i for i, p in enumerate(parts[:-1]) if p.isdigit()), None)
    return hook if at is None else f"block {parts[at]} {'.'.join(parts[at + 1:])}"


def layer_labels(hooks: Any) -> dict[str, str]:
    """{hook: legend name} by `layer_name`, each layer's its own: where two would share a name
    (`encoder.0.ff.1` and `decoder.0.ff.1`), every layer keeps its full name."""
    names = {h: layer_name(h) for h in sorted(hooks)}
    return names if len(set(names.values())) == len(names) else {h: h for h in names}


def ema(values: list[float], weight: float) -> list[float]:
    """TensorBoard's debiased exponential moving average (its scalar dashboard's smoothing):
    last = weight * last + (1 - weight) * x from last = 0, shown as last / (1 - weight ** n) after
    the n-th finite value; a non-finite value is passed through and skipped, and a constant
    series is left as it is. weight 0 returns the values."""
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"the smoothing weight must be in [0, 1), got {weight}")
    finite = [v for v in values if math.isfinite(v)]
    if weight == 0.0 or (finite and all(v == finite[0] for v in finite) and len(finite) == len(values)):
        return list(values)
    out, last, n = [], 0.0, 0
    for v in values:
        if not math.isfinite(v):
            out.append(v)
            continue
        last = weight * last + (1 - weight) * v
        n += 1
        out.append(last / (1 - weight ** n))
    return out


def smoothed(frame_rows: list[dict], y: str, color: str, weight: float) -> list[dict]:
    """The rows with `smoothed` added: the EMA of `y` over steps within each `color` series."""
    out = [dict(r) for r in sorted(frame_rows, key=lambda r: (str(r[color]), r["step"]))]
    for name in dict.fromkeys(r[color] for r in out):
        series = [r for r in out if r[color] == name]
        for r, s in zip(series, ema([as_float(r[y]) for r in series], weight)):
            r["smoothed"] = s
    return out


def normalised(frame_rows: list[dict], y: str, by: float, to: str) -> list[dict]:
    """The rows with column `to` = `y` / `by` (entropy over that of uniform attention); None stays None."""
    return [{**r, to: None if r[y] is None else as_float(r[y]) / by} for r in frame_rows]


def one_line_groups(frame_rows: list[dict], y: str, color: str, within: float) -> list[list[str]]:
    """The `color` series that are drawn as one line: at every step within `within` of the group's
    first series (a pixel of the chart's y axis), NaN where it is NaN; groups of two or more, in order."""
    lines: dict[str, dict[Any, float]] = {}
    for row in frame_rows:
        value = row[y]
        lines.setdefault(row[color], {})[row["step"]] = NAN if value is None else float(value)
    groups: list[list[str]] = []
    for name, line in lines.items():
        home = next((g for g in groups if _alike(lines[g[0]], line, within)), None)
        if home is None:
            groups.append([name])
        else:
            home.append(name)
    return [g for g in groups if len(g) > 1]


def _alike(a: dict[Any, float], b: dict[Any, float], within: float) -> bool:
    return a.keys() == b.keys() and all(
        (math.isnan(a[s]) and math.isnan(b[s])) or abs(a[s] - b[s]) <= within for s in a)


def one_line_note(frame_rows: list[dict], y: str, color: str, within: float, what: str = "layers") -> str:
    """Which series lie on one line (the legend shows one colour where they cover each other):
    `all 4 layers on one line, at 0`, or `block 0 post and block 2 post on one line`; "" for none."""
    groups = one_line_groups(frame_rows, y, color, within)
    notes = []
    for group in groups:
        values = [float(r[y]) for r in frame_rows if r[color] == group[0] and r[y] is not None]
        at_zero = bool(values) and all(abs(v) <= within for v in values)
        names = f"all {len(group)} {what}" if len(group) == len({r[color] for r in frame_rows}) else \
            ", ".join(group[:-1]) + " and " + group[-1]
        notes.append(f"{names} on one line" + (", at 0" if at_zero else ""))
    return "; ".join(notes)
