"""What a metrics.jsonl record must hold to be read at all: the one check every reader of a run's
history goes through (`models.store.run.read_metrics_log`: the doctor, the timeline, the app, a
Monitor's own run), so that a malformed record is skipped, never read into a wrong answer.

A record is a JSON object whose `step` is a non-negative integer; its logged numbers are numbers
or null (null, NaN and inf are what a diverged run logs: they stay, as the doctor's evidence);
its per-layer fields (`attn_entropy`, `attn_logit_max` per head, `resid_rms` per layer) name the
layers 0..n_layers-1 of the run's model once each, with one value per head; an entropy is never
negative. Steps never go back: of records out of order, the longest run in order is kept.
Torch-free.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["MetricsLog", "RunShape", "Skipped", "in_order", "out_of_order", "problem", "run_shape"]

SCALARS = ("tokens", "lr", "train_loss", "val_loss", "val_ppl", "bpc", "grad_norm", "step_time_ms",
           "logit_max", "z_loss")
PER_HEAD = ("attn_entropy", "attn_logit_max")  # {layer: [one value per head]}
PER_LAYER = ("resid_rms",)  # {layer: one value}
TABLES = ("gwu", "activations")  # {name: {field: number}}


@dataclass(frozen=True)
class RunShape:
    """The layers and heads of the run's model (from run.json or a snapshot's config.json)."""

    n_layers: int
    n_heads: int  # 0: a model without attention (the MLP family)


def run_shape(model: Any) -> RunShape | None:
    """The shape a model config (as run.json holds it) gives its records; None when it says none."""
    if not isinstance(model, dict):
        return None
    if model.get("family") == "mlp":
        return RunShape(0, 0)
    layers, heads = model.get("n_layers"), model.get("n_heads")
    if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (layers, heads)):
        return RunShape(layers, heads)
    return None


@dataclass(frozen=True)
class Skipped:
    """One record left out: its line in the file and what was wrong with it."""

    line: int
    reason: str
    truncated: bool = False  # a JSON line cut short at the end of the file (a write killed midway)


@dataclass
class MetricsLog:
    """The records of one metrics.jsonl that passed the check, and those skipped."""

    path: Path
    records: list[dict[str, Any]]
    skipped: list[Skipped] = field(default_factory=list)

    def skipped_text(self) -> str | None:
        """'2 malformed records of RUN/metrics.jsonl skipped (lines 5, 9)', or None."""
        if not self.skipped:
            return None
        lines = ", ".join(str(s.line) for s in self.skipped[:5]) + (", ..." if len(self.skipped) > 5 else "")
        n = len(self.skipped)
        return f"{n} malformed record{'s' if n > 1 else ''} of {self.path} skipped (line{'s' if n > 1 else ''} {lines})"


def is_number(value: Any) -> bool:
    """A logged number: an int or float (NaN and inf included), or null (how JSON writes NaN)."""
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def problem(record: Any, shape: RunShape | None = None) -> str | None:
    """What is wrong with one record, checked against the run's shape when known; None if nothing."""
    if not isinstance(record, dict):
        return f"expected a JSON object, got {type(record).__name__}"
    step = record.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return f"'step' must be a non-negative integer, got {step!r}"
    for key in SCALARS:
        if key in record and not is_number(record[key]):
            return f"'{key}' must be a number or null, got {short(record[key])}"
    for key in PER_HEAD + PER_LAYER:
        if record.get(key) is not None:
            why = layers_problem(key, record[key], shape)
            if why:
                return why
    for key in TABLES:
        if record.get(key) is not None:
            why = table_problem(key, record[key])
            if why:
                return why
    return None


def layers_problem(key: str, raw: Any, shape: RunShape | None) -> str | None:
    """A per-layer field: {layer: [per head]} (or {layer: value}), every layer of the model once."""
    if shape is not None and shape.n_heads == 0:
        return f"'{key}' is logged, but the run's model has no attention layers"
    if not isinstance(raw, dict):
        return f"'{key}' must map layers to {'per-head lists' if key in PER_HEAD else 'values'}, got {short(raw)}"
    names = sorted(str(layer) for layer in raw)
    expected = sorted(str(layer) for layer in range(shape.n_layers if shape else len(raw)))
    if names != expected:
        model = f"the run's {shape.n_layers}-layer model" if shape else "layers numbered from 0"
        return f"'{key}' has layers {names}, not those of {model} ({', '.join(sorted(expected, key=int))})"
    heads = shape.n_heads if shape else None  # unknown: the first layer's count, the same in every layer
    for layer, value in raw.items():
        why = values_problem(key, layer, value, heads)
        if why:
            return why
        if heads is None and key in PER_HEAD:
            heads = len(value)
    return None


def values_problem(key: str, layer: Any, value: Any, heads: int | None) -> str | None:
    """One layer's value(s) of a per-layer field: numbers or null, one per head, entropies >= 0."""
    if key not in PER_HEAD:
        return None if is_number(value) else f"'{key}' of layer {layer} must be a number or null, got {short(value)}"
    if not isinstance(value, list):
        return f"'{key}' of layer {layer} must be a list over heads, got {short(value)}"
    if heads is not None and len(value) != heads:
        return f"'{key}' of layer {layer} has {len(value)} values for {heads} heads"
    bad = next((v for v in value if not is_number(v)), None)
    if bad is not None:
        return f"'{key}' of layer {layer} holds {short(bad)}, not a number"
    if key == "attn_entropy" and any(v is not None and v < 0 for v in value):
        return f"'{key}' of layer {layer} holds a negative entropy ({min(v for v in value if v is not None)})"
    return None


def table_problem(key: str, raw: Any) -> str | None:
    """g/w/u or activation health: {name: {field: number or null}}."""
    if not isinstance(raw, dict):
        return f"'{key}' must map names to their numbers, got {short(raw)}"
    for name, row in raw.items():
        if not isinstance(row, dict) or not all(is_number(v) for v in row.values()):
            return f"'{key}' of {name} must map fields to numbers, got {short(row)}"
    return None


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def in_order(steps: list[int]) -> set[int]:
    """The indices of the longest run of steps that never goes back (ties: the later records);
    the others are out of order. One stray step (a typo of 10**6, an old line pasted in) costs
    that record alone, never the records after it."""
    tails: list[int] = []  # tails[k]: the smallest last step of a kept run of length k+1
    tail_at: list[int] = []  # the index holding it
    before = [-1] * len(steps)
    for i, step in enumerate(steps):
        k = bisect_right(tails, step)
        before[i] = tail_at[k - 1] if k else -1
        if k == len(tails):
            tails.append(step)
            tail_at.append(i)
        else:
            tails[k], tail_at[k] = step, i
    kept, i = set(), tail_at[-1] if tail_at else -1
    while i >= 0:
        kept.add(i)
        i = before[i]
    return kept


def out_of_order(kept_steps: list[int | None], i: int, step: int) -> str:
    """Why record i (not kept: None in `kept_steps`) is out of order, by the kept steps around it."""
    before = next((s for s in reversed(kept_steps[:i]) if s is not None), None)
    after = next((s for s in kept_steps[i + 1:] if s is not None), None)
    around = " and ".join(f"{word} step {s}" for word, s in (("after", before), ("before", after)) if s is not None)
    return f"step {step} is out of order ({around}): steps must not go back"
