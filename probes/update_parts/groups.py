"""Which g/w/u group each parameter of a model we never rebuilt belongs to, from the layout the
Monitor found rather than from its names: run.json's `model.parameter_groups` ({name: group}, the
names as the g/w/u table writes them), which `probes.update_parts.report` reads before its name patterns.

From one eval forward on the eval tokens:
- embeddings: the tables `models.layout.find_layout` saw read the ids and the positions;
- unembedding: the Linear the logits come out of (a tied one is the embedding's weight, named once);
- norms: the final norm's parameters, and inside a block any module that holds only vectors (a
  LayerNorm, an RMSNorm written by hand: `gain`);
- attention: inside each module the attention tap read a call in (`models.tap`): a fused q/k/v
  (split by the g/w/u rows into `.q` / `.k` / `.v`) by its part, and the Linear beside it as the
  output projection (V/O); a Linear whose name says which (`q_proj`, `W_key`, ...) by its name;
  the others by the order they were called: the first two Q and K, the third V, the last of four
  or more the output projection (V/O);
- MLP: every other Linear inside a block.
A parameter none of these decides is left out, for the name patterns.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from models.layout import Layout, find_layout
from models.tap import tap_forward
from probes.update_parts.report import parameter_group
from probes.update_parts.rows import named_trainable

__all__ = ["parameter_groups"]


def _linear_calls(model: nn.Module, ids: torch.Tensor) -> tuple[list[str], list[str]]:
    """(attention modules the tap read, every Linear in the order its first call came)."""
    order: list[str] = []
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]

    def seen(name: str):
        return lambda module, args, output: order.append(name) if name not in order else None

    handles = [m.register_forward_hook(seen(name)) for name, m in linears]
    try:
        result = tap_forward(model, ids, lambda call: None)
    finally:
        for handle in handles:
            handle.remove()
    return [name for name, _ in result.layers], order


def _attention_group(name: str, module: str, part: str | None, calls: list[str], fused: set[str]) -> str | None:
    """Q/K or V/O of a Linear inside an attention module: by its fused part, by a name that says
    which (`W_query`, `q_proj`, `c_k`: one module per head calls q, k, v per head, so the order alone
    would not tell), else by its call order."""
    if part is not None:
        return "attention Q/K" if part in ("q", "k") else "attention V/O"
    named = parameter_group(name)
    if named in ("attention Q/K", "attention V/O"):
        return named
    if module not in calls:
        return None
    if fused & set(calls):
        return "attention V/O"  # beside a fused q/k/v: the output projection
    i = calls.index(module)
    if i == len(calls) - 1 and len(calls) >= 4:
        return "attention V/O"  # the output projection, called after q, k and v
    return "attention Q/K" if i < 2 else "attention V/O"


def _inside(name: str, prefixes: list[str]) -> str | None:
    return next((p for p in prefixes if name == p or name.startswith(p + ".")), None)


def _only_vectors(module: nn.Module) -> bool:
    params = list(module.parameters(recurse=False))
    return bool(params) and all(p.dim() == 1 for p in params) and not isinstance(module, (nn.Linear, nn.Embedding))


def group_by_layout(model: nn.Module, layout: Layout, attention: list[str], calls: list[str]) -> dict[str, str]:
    """{parameter name: group} for the parameters the layout decides (see the module's docstring)."""
    modules = dict(model.named_modules())
    tables = {layout.token_embedding, layout.position_embedding} - {None}
    names = list(named_trainable(model))
    fused = {n.rsplit(".", 2)[0] for n in names  # the Linears whose rows are split into q, k, v
             if n.rsplit(".", 2)[-2:-1] in (["q"], ["k"], ["v"]) and n.rsplit(".", 1)[0] not in modules}
    out: dict[str, str] = {}
    for name in names:
        owner, _, leaf = name.rpartition(".")
        part = None
        if owner.rsplit(".", 1)[-1] in ("q", "k", "v") and owner not in modules:  # a fused q/k/v's rows
            owner, part = owner.rsplit(".", 1)
        module = modules.get(owner)
        attn = _inside(owner, attention)
        if name in tables:
            out[name] = "embeddings"
        elif layout.unembedding and owner == layout.unembedding:
            out[name] = "unembedding"
        elif layout.final_norm in modules and _inside(owner, [layout.final_norm]):
            out[name] = "norms"
        elif module is not None and _only_vectors(module) and _inside(owner, layout.blocks):
            out[name] = "norms"
        elif attn is not None and isinstance(module, nn.Linear):
            group = _attention_group(name, owner, part, [c for c in calls if _inside(c, [attn])], fused)
            if group is not None:
                out[name] = group
        elif isinstance(module, nn.Linear) and _inside(owner, layout.blocks):
            out[name] = "MLP"
    return out


def parameter_groups(model: nn.Module, ids: torch.Tensor) -> dict[str, Any]:
    """run.json's `parameter_groups` of `model`, from one eval forward on ids [batch pos]."""
    layout = find_layout(model, ids)
    attention, calls = _linear_calls(model, ids)
    return group_by_layout(model, layout, attention, calls)
