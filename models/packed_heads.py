"""All heads' q/k/v weights of a layer in one parameter, under the series' per-head names.

An `Attention` keeps `W_QKV` [d_model 3*n_heads*d_head] (columns ordered q|k|v, then head, then
d_head: the layout its one q/k/v matmul wants) and, with biases, `b_QKV` [3*n_heads*d_head]. One
autograd leaf instead of three per head: a per-head leaf costs its own gradient node and copy,
10-15 us each per backward (`benchmarks/bench_model.py`, batch 1). What users see keeps the
series' names:

- `state_dict()` holds `heads.{j}.W_Q|W_K|W_V|b_Q|b_K|b_V` (copies: safetensors refuses tensors
  that share storage), and `load_state_dict` packs them back, so series `.pt` files and
  snapshots saved before the packing load unchanged;
- `attention.heads[j].W_Q` is a [d_model d_head] view of the packed parameter (writes go through);
- `series_layout` / `named_rows` list every parameter (or its gradient) under the series' names,
  one row per head, as the g/w/u table reports them; `pack_optimizer_state` reads optimizer state
  saved with per-head parameters.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch

KINDS = ("Q", "K", "V")
PACKED = {"W": "W_QKV", "b": "b_QKV"}  # per-head prefix -> packed parameter name


class HeadView:
    """`attention.heads[j]`: head j's W_Q, W_K, W_V (and b_Q, b_K, b_V) as views of the packed
    parameters, [d_model d_head] and [d_head]; a name the layer has no parameter for raises
    AttributeError, as a missing parameter would."""

    __slots__ = ("attention", "index")

    def __init__(self, attention: Any, index: int):
        self.attention, self.index = attention, index

    def __getattr__(self, name: str) -> torch.Tensor:
        if name in ("attention", "index"):  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        packed = packed_source(self.attention, name)
        if packed is None:
            raise AttributeError(f"head {self.index} has no parameter {name!r}")
        return packed[..., columns(self.attention.cfg, name[-1], self.index)]

    def __repr__(self) -> str:
        return f"HeadView(head {self.index})"


def packed_source(attention: Any, name: str) -> torch.Tensor | None:
    """The packed parameter holding per-head `name` (W_Q ... b_V), or None."""
    if len(name) != 3 or name[1] != "_" or name[2] not in KINDS or name[0] not in PACKED:
        return None
    return attention._parameters.get(PACKED[name[0]])


def columns(cfg: Any, kind: str, head: int) -> slice:
    """Head `head`'s columns of q, k or v in a packed [.. 3*n_heads*d_head] tensor."""
    start = (KINDS.index(kind) * cfg.n_heads + head) * cfg.d_head
    return slice(start, start + cfg.d_head)


def per_head_names(attention: Any) -> Iterator[tuple[str, str, slice]]:
    """(series name, packed name, columns) for each head's parameters, in the series' order:
    head by head, W_Q W_K W_V then b_Q b_K b_V."""
    cfg = attention.cfg
    for j in range(cfg.n_heads):
        for prefix, packed in PACKED.items():
            if packed in attention._parameters:
                for kind in KINDS:
                    yield f"heads.{j}.{prefix}_{kind}", packed, columns(cfg, kind, j)


def head_rows(attention: Any, tensors: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor | None]:
    """Split packed tensors (packed name -> the parameter, its gradient or a copy; None stays
    None) into series name -> head view, in the series' order."""
    return {name: None if tensors.get(packed) is None else tensors[packed][..., cols]
            for name, packed, cols in per_head_names(attention)}


def series_layout(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Parameter, slice | None]]:
    """Each trainable parameter under its series name and in the series' order (`named_parameters`
    order, a layer's heads where its packed q/k/v sits): (name, the parameter holding it now, its
    columns there or None for a whole parameter)."""
    layers: dict[int, tuple[str, Any]] = {}  # a layer's first packed parameter -> (prefix, layer)
    later: set[int] = set()  # its other packed parameters: listed with the first
    for prefix, module in model.named_modules():
        packed = [p for n in PACKED.values() if (p := module._parameters.get(n)) is not None]
        if PACKED["W"] in module._parameters:
            layers[id(packed[0])] = (prefix + "." if prefix else "", module)
            later.update(id(p) for p in packed[1:])
    for name, param in model.named_parameters():
        if not param.requires_grad or id(param) in later:
            continue
        if id(param) not in layers:
            yield name, param, None
            continue
        prefix, module = layers[id(param)]
        for key, packed_name, cols in per_head_names(module):
            yield prefix + key, module._parameters[packed_name], cols


def named_rows(model: torch.nn.Module, pick: Any = None) -> dict[str, Any]:
    """Every trainable parameter by its series name (`series_layout`), a head as a view of its
    packed parameter; `pick(param)` chooses what is listed (default the parameter; e.g. its
    gradient, None where it has none)."""
    rows: dict[str, Any] = {}
    for name, param, cols in series_layout(model):
        value = param if pick is None else pick(param)
        rows[name] = value if cols is None or value is None else value[..., cols]
    return rows


# ---------------------------------------------------------------- state dicts

def unpack_state_dict(attention: Any, state_dict: dict, prefix: str, local_metadata: Any) -> None:
    """state_dict hook: the packed parameters leave, each head's copies take their place."""
    packed = {name: state_dict.pop(prefix + name) for name in PACKED.values() if prefix + name in state_dict}
    for name, tensor in head_rows(attention, packed).items():
        if tensor is not None:
            # contiguous, its own storage; a meta skeleton's stays a view (a meta clone runs
            # torch's Python reference ops, whose first use imports sympy: ~0.4 s per load)
            state_dict[prefix + name] = tensor if tensor.is_meta else tensor.clone()


def pack_state_dict(attention: Any, state_dict: dict, prefix: str, local_metadata: Any, strict: bool,
                    missing_keys: list, unexpected_keys: list, error_msgs: list) -> None:
    """load_state_dict pre-hook: per-head entries are packed into the layer's parameters. An
    absent head is reported missing under its series name (its columns keep their values), a
    wrongly shaped one as a size mismatch, as for any parameter."""
    for packed_name in PACKED.values():
        param = attention._parameters.get(packed_name)
        if param is None:
            continue
        entries = [(name, cols) for name, packed, cols in per_head_names(attention) if packed == packed_name]
        given = [prefix + name in state_dict for name, _ in entries]
        if prefix + packed_name in state_dict and not any(given):
            continue  # already packed
        # a model built on the meta device (loaded with assign=True) has no values to start from:
        # the packed tensor is made where the first head's entry lives
        packed = None if param.is_meta else param.detach().clone()
        for (name, cols), present in zip(entries, given):
            if not present:
                missing_keys.append(prefix + name)
                continue
            value = state_dict.pop(prefix + name)
            expected = param[..., cols].shape
            if not isinstance(value, torch.Tensor) or value.shape != expected:
                shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                error_msgs.append(f"size mismatch for {prefix + name}: copying a param with shape {shape} "
                                  f"from checkpoint, the shape in current model is {tuple(expected)}.")
                continue
            if packed is None:
                packed = torch.empty(param.shape, dtype=value.dtype, device=value.device)
            packed[..., cols] = value
        if packed is not None:
            state_dict[prefix + packed_name] = packed


# ---------------------------------------------------------------- optimizer state

def pack_optimizer_state(state: dict, optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> dict:
    """Optimizer state saved when each head had its own parameters, rewritten for the packed
    ones (per-head moments side by side, as the weights are). Each parameter group keeps its
    parameters in model order, so group by group the saved ids map onto `series_layout`.
    State that already fits, or that this cannot map (another model), comes back unchanged for
    `check_optimizer_state` to judge."""
    model_params = [p for p in model.parameters() if p.requires_grad]
    order = [(param, cols) for _, param, cols in series_layout(model)]  # as the state was saved
    groups = state.get("param_groups") if isinstance(state, dict) else None
    saved = state.get("state") if isinstance(state, dict) else None
    if not isinstance(groups, list) or not isinstance(saved, dict) or len(groups) != len(optimizer.param_groups) \
            or len(order) == len(model_params):
        return state
    new_groups, new_state, new_id = [], {}, 0
    for old, group in zip(groups, optimizer.param_groups):
        members = {id(p) for p in group["params"]}
        entries = [(p, cols) for p, cols in order if id(p) in members]  # this group, series order
        old_ids = old.get("params") if isinstance(old, dict) else None
        if not isinstance(old_ids, list) or len(old_ids) != len(entries):
            return state
        by_param: dict[int, list[tuple[Any, slice | None]]] = {id(p): [] for p in group["params"]}
        for old_id, (p, cols) in zip(old_ids, entries):
            by_param[id(p)].append((saved.get(old_id), cols))
        for p in group["params"]:
            parts = by_param[id(p)]
            if parts and all(isinstance(entry, dict) for entry, _ in parts):  # no step, no state
                new_state[new_id] = parts[0][0] if parts[0][1] is None else {
                    key: _pack_entry([(e[key], cols) for e, cols in parts], p) for key in parts[0][0]}
            new_id += 1
        new_groups.append({**old, "params": list(range(new_id - len(group["params"]), new_id))})
    return {"state": new_state, "param_groups": new_groups}


def _pack_entry(values: list[tuple[Any, slice]], param: torch.Tensor) -> Any:
    """One optimizer-state key over a packed parameter's heads: tensors of a head's shape are
    laid out as the weights are; anything else (Adam's step count) is the first head's."""
    first = values[0][0]
    if not isinstance(first, torch.Tensor) or first.dim() == 0:
        return first
    packed = torch.zeros(param.shape, dtype=first.dtype, device=first.device)
    for value, cols in values:
        packed[..., cols] = value
    return packed
