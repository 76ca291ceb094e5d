"""Which optimizer updates each parameter, for the doctor's update-ratio rules: a Muon step has a
set size by design, so its u is judged against what Muon makes (`probes.doctor.update_scale`), not
against makemore's band for SGD and Adam. Written into run.json once, by the names the g/w/u
table uses (`probes.update_parts.rows.named_trainable`: a packed q/k/v as its rows).

Told per parameter group, from what the optimizer says of itself: nanochat's MuonAdamW puts
`kind: 'muon' | 'adamw'` on each group, Keller Jordan's MuonWithAuxAdam `use_muon: True | False`;
otherwise the class name (torch.optim.Muon, Adam, AdamW, SGD, Adafactor, a Lion or a Muon of
anyone's). torch's Muon with `adjust_lr_fn='match_rms_adamw'` scales its step to AdamW's size,
so it is judged as AdamW is ("muon_rms").
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["optimizer_kinds"]

KNOWN = ("muon", "adamw", "adam", "sgd", "lion", "adafactor")


def group_kind(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> str:
    """The kind of optimizer that updates one param group's parameters."""
    named = group.get("kind")
    if isinstance(named, str) and named:  # nanochat's MuonAdamW
        return named.lower()
    if isinstance(group.get("use_muon"), bool):  # Keller Jordan's MuonWithAuxAdam
        return "muon" if group["use_muon"] else "adam"
    name = type(optimizer).__name__.lower()
    kind = next((k for k in KNOWN if k in name), name)
    if kind == "muon" and group.get("adjust_lr_fn") == "match_rms_adamw":
        return "muon_rms"
    if kind == "adafactor" and group.get("scale_parameter") is False:  # transformers' Adafactor with
        return "adam"  # absolute steps: an Adam without its first moment
    return kind


def matrix_shape(param: torch.Tensor) -> list[int] | None:
    """[rows, cols] as Muon orthogonalises the parameter (a 4-D filter flattened past its first
    dimension, as Keller Jordan's Muon does); None for one of fewer than two dimensions."""
    if param.dim() < 2:
        return None
    return [int(param.shape[0]), int(math.prod(param.shape[1:]))]


def optimizer_kinds(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """{"optimizer_kinds": {name: kind}, "muon_shapes": {name: [rows, cols]}} for run.json, keyed
    by the g/w/u table's names; {} when one optimizer of one kind updates everything (the
    run's `train.optimizer` says it; a Muon's shapes are written even then)."""
    from probes.update_parts.rows import named_trainable

    kind_of: dict[int, tuple[str, torch.Tensor]] = {}  # storage -> (kind, the parameter)
    for group in optimizer.param_groups:
        kind = group_kind(optimizer, group)
        for p in group["params"]:
            kind_of[p.untyped_storage().data_ptr()] = (kind, p)
    kinds: dict[str, str] = {}
    shapes: dict[str, list[int]] = {}
    for name, tensor in named_trainable(model).items():
        found = kind_of.get(tensor.untyped_storage().data_ptr()) if tensor is not None else None
        if found is None:
            continue
        kind, param = found
        kinds[name] = kind
        if kind == "muon" and (shape := matrix_shape(param)) is not None:
            shapes[name] = shape
    if not shapes and len(set(kinds.values())) <= 1:
        return {}
    return {"optimizer_kinds": kinds, **({"muon_shapes": shapes} if shapes else {})}
