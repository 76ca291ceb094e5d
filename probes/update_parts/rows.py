"""The rows `probes.updates` measures g / w / u on: every trainable parameter by the series' name
(wrapper prefixes stripped, our packed heads one row each, a packed q/k/v projection split into
q, k and v rows), a snapshot of them before a step, and each row's learning rate."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from models.packed_heads import named_rows, series_layout

__all__ = ["lr_by_name", "named_trainable", "packed_name", "snapshot_params", "split_packed_qkv",
           "strip_wrapper_prefix"]

WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DistributedDataParallel, torch.compile
BRIDGE_WRAPPER = "_original_component."  # a TransformerBridge wraps every module of the model in one


def strip_wrapper_prefix(name: str) -> str:
    """`module._orig_mod.blocks.0.attention.W_O` -> `blocks.0.attention.W_O` (the series' name);
    a TransformerBridge's `layers.0._original_component.attn._original_component.q.weight` ->
    `layers.0.attn.q.weight` (the wrapped model's own name)."""
    name = name.replace(BRIDGE_WRAPPER, "")
    changed = True
    while changed:
        changed = False
        for prefix in WRAPPER_PREFIXES:
            if name.startswith(prefix):
                name, changed = name[len(prefix):], True
    return name


def named_trainable(model: nn.Module, grads: bool = False) -> dict[str, torch.Tensor | None]:
    """Trainable parameters (with `grads`, their gradients, None where there is none) by the
    series' names (DDP/compile prefixes stripped): one entry per head for a layer's q/k/v,
    which our models keep in one packed parameter (`models.packed_heads`)."""
    rows = split_packed_qkv(model, named_rows(model, (lambda p: p.grad) if grads else None))
    return {strip_wrapper_prefix(n): t for n, t in rows.items()}


PACKED_QKV = ("c_attn", "qkv", "query_key_value", "wqkv", "qkv_proj")  # GPT-2, tutorials, GPT-NeoX, MPT (Wqkv), Phi-3
# (compared in lower case: MPT's Wqkv, InternLM's and hand-written Llamas' wqkv)
HEAD_INTERLEAVED = ("gpt_neox", "bloom")  # query_key_value rows as [head (q k v) d_head], not [(q k v) head d_head]


def split_packed_qkv(model: nn.Module, rows: dict[str, Any]) -> dict[str, Any]:
    """A packed q/k/v projection as three rows ``<module>.q|k|v.weight`` (views), so that Q/K and
    V are grouped apart as they are for our models: GPT-2's ``attn.c_attn`` (nanoGPT's nn.Linear
    [3d d], Hugging Face's Conv1D [d 3d], bias [3d]), a tutorial's ``qkv``, GPT-NeoX's and BLOOM's
    ``query_key_value`` (whose rows are per head: [head 3 d_head]) and torch's
    nn.MultiheadAttention ``in_proj_weight`` / ``in_proj_bias``. Other rows as they are, in order."""
    packed: dict[str, tuple[str, int, int]] = {}  # name -> (kind, dim, heads: 0 for [3 ...] thirds)
    interleaved = getattr(getattr(model, "config", None), "model_type", None) in HEAD_INTERLEAVED
    for prefix, module in model.named_modules():
        last = prefix.rsplit(".", 1)[-1]
        if isinstance(module, nn.MultiheadAttention) and getattr(module, "in_proj_weight", None) is not None:
            packed.update({f"{prefix}.in_proj_weight": ("weight", 0, 0), f"{prefix}.in_proj_bias": ("bias", 0, 0)})
        elif last.lower() in PACKED_QKV and isinstance(getattr(module, "weight", None), torch.Tensor):
            conv1d = type(module).__name__ == "Conv1D"  # transformers.pytorch_utils.Conv1D
            heads = _heads_of(model) if interleaved and last == "query_key_value" else 0
            packed.update({f"{prefix}.weight": ("weight", -1 if conv1d else 0, heads),
                           f"{prefix}.bias": ("bias", -1 if conv1d else 0, heads)})
    out: dict[str, Any] = {}
    for name, tensor in rows.items():
        if name not in packed or (tensor is not None and tensor.shape[packed[name][1]] % 3):
            out[name] = tensor
            continue
        kind, dim, heads = packed[name]
        thirds = [None] * 3 if tensor is None else _qkv_thirds(tensor, dim, heads)
        base = name[:-len("_weight" if kind == "weight" else "_bias")] if ".in_proj_" in name else name[:-len(kind) - 1]
        for part, third in zip("qkv", thirds):
            out[f"{base}.{part}.{kind}"] = third
    return out


def _heads_of(model: nn.Module) -> int:
    """The heads of a packed ``query_key_value``, from the model's config (0 if it does not say)."""
    config = getattr(model, "config", None)
    return int(getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None) or 0)


def _qkv_thirds(tensor: torch.Tensor, dim: int, heads: int) -> tuple[torch.Tensor, ...]:
    """q, k, v of a packed tensor along `dim` (views): [(q k v) ...] thirds, or with `heads`,
    [head (q k v) d_head] rows (GPT-NeoX) whose q of every head is one strided view."""
    if not heads or tensor.shape[dim] % (3 * heads):
        return tensor.chunk(3, dim=dim)
    dim = dim % tensor.dim()
    shape = tensor.shape
    split = tensor.view(*shape[:dim], heads, 3, shape[dim] // (3 * heads), *shape[dim + 1:])
    return tuple(split.select(dim + 1, i) for i in range(3))  # each [... head d_head ...]


def snapshot_params(model: nn.Module) -> dict[str, torch.Tensor]:
    """Detached copies of every trainable parameter: take one just before `optimizer.step()`.
    Laid out as `clone()` lays them out, filled by one fused copy (a launch per tensor would be
    one per parameter on a GPU)."""
    rows = named_trainable(model)
    sources = [t.detach() for t in rows.values()]
    copies = [torch.empty_like(t) for t in sources]
    if copies:
        torch._foreach_copy_(copies, sources)
    return dict(zip(rows, copies))


def packed_name(name: str) -> str:
    """The parameter a split row belongs to: `attn.qkv.q.weight` -> `attn.qkv.weight`,
    `attn.in_proj.k.bias` -> `attn.in_proj_bias` (the name itself for any other)."""
    parts = name.split(".")
    if len(parts) < 3 or parts[-2] not in ("q", "k", "v"):
        return name
    if parts[-3] == "in_proj":
        return ".".join(parts[:-2])[:-len("in_proj")] + f"in_proj_{parts[-1]}"
    return ".".join(parts[:-2] + parts[-1:])


def lr_by_name(model: nn.Module, optimizer: Any) -> float | dict[str, float]:
    """The learning rate of each trainable parameter by its name (wrapper prefixes stripped), as
    its param group sets it now; one float when every group has the same."""
    lrs = [group.get("lr") for group in optimizer.param_groups]
    if len(set(lrs)) <= 1:
        return float(lrs[0] or 0.0) if lrs else 0.0
    of = {id(p): float(group.get("lr") or 0.0) for group in optimizer.param_groups for p in group["params"]}
    # by the rows' names: our heads' rows (blocks.0.attention.heads.1.W_Q) take the lr of the packed
    # parameter they sit in, which named_parameters alone would not name
    return {strip_wrapper_prefix(n): of[id(p)] for n, p, _ in series_layout(model) if id(p) in of}
