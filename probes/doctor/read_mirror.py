"""The Monitor's readings read back from the W&B run or TensorBoard log it mirrored into
(train.monitor.wandb_mirror): its `scratchscope/*` keys, by their exact names, turned into the fields a
metrics.jsonl record holds, so that the doctor gives the same run the same verdict from any of them.

    scratchscope/attn_entropy/layer_0/head_1   -> attn_entropy   {"0": [.., h1, ..]}
    scratchscope/attn_logit_max/layer_0/head_1 -> attn_logit_max {"0": [.., h1, ..]}
    scratchscope/attn_entropy/layer_0          -> attn_entropy   {"0": [mean]}  (a mirror without head keys)
    scratchscope/resid_rms/layer_0             -> resid_rms      {"0": value}
    scratchscope/logit_max, grad_norm          -> logit_max, grad_norm
    scratchscope/dead_units/<hook>, saturated_units/<hook> -> activations {hook: {dead, saturated}}
    scratchscope/update_log10_u/<group>        -> u_groups {group: median log10 u}  (the rules' groups,
                                                  each on its own optimizer's scale: read as a GroupReport)
    scratchscope/diverged                      -> diverged {"reason": ...}
    scratchscope/run (W&B config; TensorBoard text)  -> the run's run.json, whose facts the rules read

What the mirror does not carry (each parameter's g/w/u: frozen parameters and the Q/K-against-MLP
gap of `slow_qk`; a rescue's plan) is not logged there, and the rules say so.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from probes.doctor.log_file import Log
from probes.update_parts.report import GROUPS

__all__ = ["MIRROR", "RUN_KEY", "GroupReport", "key_part", "mirrored_fields", "run_facts", "with_run_facts"]

MIRROR = "scratchscope/"  # every key the Monitor writes into a user's W&B run or SummaryWriter
RUN_KEY = MIRROR + "run"  # run.json, in the W&B run's config / as TensorBoard text
PER_LAYER = ("attn_entropy", "attn_logit_max")  # a layer key, and a key per head under it
DIVERGED_REASON = "the Monitor reported a divergence (scratchscope/diverged)"


def key_part(name: Any) -> str:
    """A parameter group or layer name as one part of a key: 'attention Q/K' -> 'attention_q_k'."""
    return re.sub(r"[^0-9A-Za-z_.]+", "_", str(name)).strip("_").lower()


GROUP_OF_KEY = {key_part(g): g for g in GROUPS}


def number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def mirrored_fields(row: dict[str, Any]) -> dict[str, Any]:
    """One step's `scratchscope/*` values (a W&B row, a TensorBoard step) as metrics.jsonl fields."""
    out: dict[str, Any] = {}
    heads: dict[str, dict[str, dict[int, float]]] = {}  # name -> layer -> head -> value
    for key, raw in row.items():
        value = number(raw)
        if value is None or not key.startswith(MIRROR):
            continue
        parts = key[len(MIRROR):].split("/")
        name = parts[0]
        if name in ("logit_max", "grad_norm", "train_loss", "val_loss") and len(parts) == 1:
            out[name] = value
        elif name == "diverged" and len(parts) == 1:
            out["diverged"] = {"reason": DIVERGED_REASON}
        elif name in PER_LAYER + ("resid_rms",) and len(parts) in (2, 3) and parts[1].startswith("layer_"):
            layer = parts[1].removeprefix("layer_")
            head = parts[2].removeprefix("head_") if len(parts) == 3 else None
            if head is None:
                heads.setdefault(name, {}).setdefault(layer, {}).setdefault(-1, value)
            elif head.isdigit():
                heads.setdefault(name, {}).setdefault(layer, {})[int(head)] = value
        elif name in ("dead_units", "saturated_units") and len(parts) == 2:
            out.setdefault("activations", {}).setdefault(parts[1], {})[name.removesuffix("_units")] = value
        elif name == "update_log10_u" and len(parts) == 2:
            out.setdefault("u_groups", {})[GROUP_OF_KEY.get(parts[1], parts[1])] = value
    for name, layers in heads.items():
        out[name] = {layer: per_head(name, layers[layer]) for layer in sorted(layers, key=natural)}
    # in the order the Monitor wrote them (a W&B row's keys come back in no set order)
    if "activations" in out:
        out["activations"] = {hook: out["activations"][hook] for hook in sorted(out["activations"], key=natural)}
    if "u_groups" in out:
        order = {g: i for i, g in enumerate(GROUPS)}
        out["u_groups"] = dict(sorted(out["u_groups"].items(), key=lambda kv: order.get(kv[0], len(order))))
    return out


def natural(name: str) -> list[Any]:
    """'blocks.10.mlp' after 'blocks.2.mlp': numbers compared as numbers."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", name)]


def per_head(name: str, values: dict[int, float]) -> Any:
    """A layer's heads in order (the layer's own key, a mean or max over them, only without them)."""
    heads = sorted(h for h in values if h >= 0)
    if name == "resid_rms":
        return values.get(-1, math.nan)
    return [values[h] for h in heads] if heads else [values[-1]]


def run_facts(value: Any) -> dict[str, Any] | None:
    """The mirrored run.json (a dict from W&B's config, JSON text from TensorBoard), or None."""
    if isinstance(value, dict) and "value" in value and len(value) <= 2:  # config.yaml's {value: ..., desc: ...}
        value = value["value"]
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) and isinstance(value.get("model", {}), dict) else None


@dataclass
class GroupReport:
    """An UpdateReport's groups alone, as the mirror carries them (no parameter of its own)."""

    step: int
    medians: dict[str, float]
    parameters: dict[str, Any] = field(default_factory=dict)
    group_of: dict[str, str] = field(default_factory=dict)
    groups: dict[str, dict[str, Any]] = field(init=False)  # as UpdateReport.groups

    def __post_init__(self) -> None:
        self.groups = {g: {"median_log10_u": m if math.isfinite(m) else None, "parameters": []}
                       for g, m in self.medians.items()}


def with_run_facts(log: Log, facts: dict[str, Any] | None) -> Log:
    """A log whose run the Monitor watched, with its run.json: the model, training and trainer
    from there (what the run folder says), the log's own config filling what it lacks."""
    if facts is None:
        return log
    log.info = facts
    model, train = facts.get("model"), facts.get("train")
    log.model = {**log.model, **(model if isinstance(model, dict) else {})}
    log.train = {**log.train, **(train if isinstance(train, dict) else {})}
    if isinstance(facts.get("trainer"), str):
        log.trainer = facts["trainer"]
    return log
