"""g / w / u per named parameter: gradient size, weight size and relative update size.

The series' table (`W_pos  g=2.4e-04 w=9.9e-01 u=1.2e-05`) and makemore's update:data ratio:

    g = rms(grad)                          how big the gradient entries are
    w = rms(param)                         how big the weights are
    u = rms(param_after - param_before) / rms(param_after)
                                           the fraction of the weights one optimizer step moved
    u_nominal = lr * g / w                 the series' formula; equals u for plain SGD only

`u` is measured from the actual step, so it is right for SGD with momentum, Adam and AdamW
alike (Adam moves every entry by about lr whatever g is, so there u ~ lr / w, not lr * g / w).
makemore's healthy band is log10(u) around -3.

Undefined ratios: when w == 0 (e.g. a zero-initialised bias that did not move) `u` and
`u_nominal` are None (JSON null, shown as `-` in the table); a parameter without a gradient
has g = None and u_nominal = None. Everything here is a pure function of tensors/modules:
no hooks, no optimizer, no I/O.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch
from torch import nn

WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DistributedDataParallel, torch.compile
TARGET_BAND = (-4.0, -2.0)  # log10(u) outside this is flagged slow / fast (makemore: ~ -3)

Table = dict[str, dict[str, float | None]]


def rms(t: torch.Tensor) -> float:
    """Root mean square of all entries, accumulated in float64 (0.0 for an empty tensor)."""
    if t.numel() == 0:
        return 0.0
    return float(t.detach().double().pow(2).mean().sqrt())


def _delta_rms(after: torch.Tensor, before: torch.Tensor) -> float:
    """rms(after - before), subtracted in float64 so tiny updates of big weights keep their digits."""
    return rms(after.double() - before.to(after.device).double())


def strip_wrapper_prefix(name: str) -> str:
    """`module._orig_mod.blocks.0.attention.W_O` -> `blocks.0.attention.W_O` (the series' name)."""
    changed = True
    while changed:
        changed = False
        for prefix in WRAPPER_PREFIXES:
            if name.startswith(prefix):
                name, changed = name[len(prefix):], True
    return name


def named_trainable(model: nn.Module) -> dict[str, nn.Parameter]:
    """Trainable parameters by the series' names (DDP/compile prefixes stripped)."""
    return {strip_wrapper_prefix(n): p for n, p in model.named_parameters() if p.requires_grad}


def snapshot_params(model: nn.Module) -> dict[str, torch.Tensor]:
    """Detached clones of every trainable parameter: take one just before `optimizer.step()`."""
    return {name: p.detach().clone() for name, p in named_trainable(model).items()}


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def gwu_table(model: nn.Module, before: Mapping[str, torch.Tensor], lr: float) -> Table:
    """g/w/u per parameter, after `optimizer.step()` and before `zero_grad()`.

    before: `snapshot_params(model)` taken just before the step. Parameters absent from
    `before` are skipped. Returns {name: {"g", "w", "u", "u_nominal"}} in module order.
    """
    table: Table = {}
    for name, param in named_trainable(model).items():
        if name not in before:
            continue
        after = param.detach()
        g = None if param.grad is None else rms(param.grad)
        w = rms(after)
        u = _ratio(_delta_rms(after, before[name]), w)
        u_nominal = None if g is None else _ratio(lr * g, w)
        table[name] = {"g": g, "w": w, "u": u, "u_nominal": u_nominal}
    return table


def _strip_state(state: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return {strip_wrapper_prefix(k): v for k, v in state.items()
            if isinstance(v, torch.Tensor) and v.is_floating_point()}


def gwu_from_snapshots(state_a: Mapping[str, Any], state_b: Mapping[str, Any]) -> Table:
    """w and u between two state dicts (a earlier, b later), e.g. two snapshots of one run.

    u = rms(b - a) / rms(b): over k optimizer steps this is the accumulated relative update,
    roughly k times the per-step u when updates keep their direction. g cannot be recovered
    offline (snapshots hold no gradients), so only "w" and "u" are returned. Tensors present in
    both with the same shape are compared; buffers that are not parameters are included as well.
    """
    a, b = _strip_state(state_a), _strip_state(state_b)
    table: Table = {}
    for name, after in b.items():
        if name not in a or a[name].shape != after.shape:
            continue
        w = rms(after)
        table[name] = {"w": w, "u": _ratio(_delta_rms(after, a[name]), w)}
    return table


def _sci(value: float | None) -> str:
    return "-" if value is None else f"{value:.1e}"


def _log10(value: float | None) -> float | None:
    return math.log10(value) if value is not None and value > 0 else None


def format_gwu(table: Table, band: tuple[float, float] = TARGET_BAND, name_width: int = 36) -> str:
    """The series' aligned table, one row per parameter, plus log10(u) and a band flag:

        W_pos                               g=2.4e-04 w=9.9e-01 u=1.2e-05 log10(u)=-4.9 u_nom=1.2e-05 slow

    `slow` / `fast` mark log10(u) below / above `band`. Rows from `gwu_from_snapshots` (no g)
    show `g=-`.
    """
    lines = []
    for name, row in table.items():
        u = row.get("u")
        lu = _log10(u)
        flag = "" if lu is None else " slow" if lu < band[0] else " fast" if lu > band[1] else ""
        lu_text = "-" if lu is None else f"{lu:+.1f}"
        lines.append(f"    {name:<{name_width}}g={_sci(row.get('g'))} w={_sci(row.get('w'))} "
                     f"u={_sci(u)} log10(u)={lu_text} u_nom={_sci(row.get('u_nominal'))}{flag}")
    return "\n".join(lines)
