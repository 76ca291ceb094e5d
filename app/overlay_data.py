"""What the Compare page overlays from several runs, as plain rows: pure functions, no Streamlit.

Every row names its run and carries both x-axes a user can pick: the step and the tokens seen
at that step, as that run's record logged them (`tokens`; NaN where a record did not log it,
never guessed from the batch size). Values are the logged ones (null, NaN and inf read as NaN):
the only derived numbers are the mean entropy of a layer's heads, entropy divided by that of
uniform attention, and 10 ** the median log10 u that `probes.updates` reports per group.
The config diff flattens run.json to dotted keys and keeps the fields whose values differ.
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable, Mapping

from probes.doctor.run_history import as_float, by_step
from probes.doctor.signals import layer_values

XS = {"step": "step", "tokens seen": "tokens"}  # the x-axis choice -> the rows' column
LAUNCH_KEYS = ("argv", "command", "started")  # run.json's record of how a run was started: always differs
ABSENT = "(absent)"  # a config field one run has and another lacks


# --------------------------------------------------------------------------- which runs, and their x


def default_runs(chosen: str | None, families: Mapping[str, tuple[str | None, ...]]) -> list[str]:
    """The overlay's first choice: the sidebar's run and the next run after it (wrapping) that shares
    its first known key, else its second, ..., else the next run. `families` maps each run's label to
    its keys, closest kin first ((preset, model class, family)), in the run list's order: a user's GPT
    is paired with another run of that class before any other transformer. A lone snapshot (`chosen`
    not a run) gets none."""
    labels = list(families)
    if chosen not in families:
        return []
    after = labels[labels.index(chosen) + 1:] + labels[:labels.index(chosen)]
    for i, key in enumerate(families[chosen]):
        match = next((l for l in after if key is not None and families[l][i] == key), None)
        if match is not None:
            return [chosen, match]
    return [chosen, after[0]] if after else [chosen]


def snapshot_b(labels: list[str], here: str, overlaid: list[str]) -> str:
    """Snapshot B's first choice among `labels` ("run / step_N", each run's in step order): the
    latest snapshot of the first overlaid run that is not A's, else the first other snapshot."""
    run_of = {label: label.rsplit(" / ", 1)[0] for label in labels}
    for run in overlaid:
        if run != run_of.get(here):
            mine = [label for label in labels if run_of[label] == run]
            if mine:
                return mine[-1]
    return next((label for label in labels if label != here), here)


def logs_tokens(records: list[dict[str, Any]]) -> bool:
    """Every record says how many tokens the run had seen (the tokens axis needs all of them)."""
    return bool(records) and all(math.isfinite(as_float(r.get("tokens"))) for r in records)


def tokens_by_step(records: list[dict[str, Any]]) -> dict[int, float]:
    """{step: tokens seen} as the run logged them (NaN where a record did not)."""
    return {r["step"]: as_float(r.get("tokens")) for r in by_step(records)}


# --------------------------------------------------------------------------- rows


def scalar_rows(run: str, records: list[dict[str, Any]], curves: dict[str, str], y: str) -> list[dict]:
    """Rows {run, curve, line, step, tokens, y} for each (curve name -> metrics key) this run logged;
    `line` ("run: curve") tells the lines apart for smoothing."""
    return [{"run": run, "curve": name, "line": f"{run}: {name}", "step": r["step"],
             "tokens": as_float(r.get("tokens")), y: as_float(r[key])}
            for name, key in curves.items() for r in by_step(records) if key in r]


def entropy_rows(run: str, records: list[dict[str, Any]], head: int | None, uniform: float | None,
                 y: str) -> list[dict]:
    """Rows {run, layer, line, step, tokens, y} of the logged attention entropy (nats): one head's,
    or with head None the mean of the layer's heads (NaN when any head is); divided by `uniform`
    (uniform attention's entropy for this run's context) when given. A layer without that head
    has no rows."""
    out = []
    for r in by_step(records):
        for layer, values in layer_values(r.get("attn_entropy")).items():  # the doctor's own reading
            if head is not None and head >= len(values):
                continue
            value = sum(values) / len(values) if head is None else values[head]
            out.append({"run": run, "layer": int(layer), "line": f"{run}: layer {layer}", "step": r["step"],
                        "tokens": as_float(r.get("tokens")), y: value / uniform if uniform else value})
    return out


def u_rows(run: str, group_records: Iterable[dict[str, Any]], tokens: dict[int, float], y: str) -> list[dict]:
    """Rows {run, group, line, step, tokens, y = 10 ** median log10 u} from
    `UpdateHistory.group_records()`; a group with no positive finite u at a step has no row there."""
    return [{"run": run, "group": g["group"], "line": f"{run}: {g['group']}", "step": g["step"],
             "tokens": tokens.get(g["step"], math.nan), y: 10 ** g["median_log10_u"]}
            for g in group_records if g["median_log10_u"] is not None]


def first_nonfinite(rows: list[dict], y: str, by: str = "line") -> list[dict]:
    """The first row (by step) of each `by` series whose `y` is NaN or inf: where a red rule goes."""
    first: dict[Any, dict] = {}
    for r in sorted(rows, key=lambda r: r["step"]):
        if not math.isfinite(as_float(r[y])) and r[by] not in first:
            first[r[by]] = {"run": r["run"], "step": r["step"], "tokens": r["tokens"],
                            "what": f"first non-finite {r.get('curve') or y} of {r['run']}"}
    return list(first.values())


def x_values(logs: Mapping[str, list[dict[str, Any]]], x: str) -> list[float]:
    """Every logged value of the x column ("step" or "tokens") over the runs' records: the extent
    that every chart of the overlay shares (`app.axes.x_range`)."""
    return [as_float(r.get(x)) for records in logs.values() for r in records]


def on_axis(rows: list[dict], x: str) -> list[dict]:
    """The rows that have a finite value of the x column (on the tokens axis: those that logged tokens)."""
    return [r for r in rows if math.isfinite(as_float(r[x]))]


# --------------------------------------------------------------------------- config diff


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"train.lr": 0.05, ...}: nested dicts to dotted keys; lists and other values as they are."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def shown(value: Any) -> str:
    """A config value as one table cell (lists and nulls as JSON: [0.9, 0.999], null)."""
    return value if isinstance(value, str) else json.dumps(value)


def config_diff(configs: Mapping[str, Mapping[str, Any]], launch: bool = False) -> list[dict[str, str]]:
    """Rows {field, <run>: value, ...} of the run.json fields whose values differ between the runs
    (a field one run lacks reads ABSENT), in first-seen order; LAUNCH_KEYS only with `launch`."""
    flat = {run: flatten(config) for run, config in configs.items()}
    fields = list(dict.fromkeys(k for f in flat.values() for k in f))
    rows = []
    for name in fields:
        if not launch and name.split(".")[0] in LAUNCH_KEYS:
            continue
        if len({json.dumps(f.get(name, ABSENT), sort_keys=True) for f in flat.values()}) > 1:  # 5 != "5"
            rows.append({"field": name, **{run: shown(f[name]) if name in f else ABSENT for run, f in flat.items()}})
    return rows
