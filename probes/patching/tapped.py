"""Patching a module with no hook points (a GPT a user wrote, nanochat's, a snapshot of any model
rebuilt with --model-code), through its own modules:

- heads: the tap (`models.tap`) finds each attention layer; the last projection (an `nn.Linear`,
  GPT-2's `Conv1D`: a leaf module with a weight matrix) called inside it whose input splits into its
  heads is the output projection, and a forward pre-hook on it reads and writes each head's z (its
  input, [batch pos head*d_head] with heads outermost, as every layout concatenates them);
- attn: a forward hook on the attention module's output;
- mlp: a forward hook on the output of the attention's sibling with the most parameters that is not
  a norm;
- resid: a forward pre-hook on the block's input; a block that returns a delta to which its parent
  adds the residual (`x = x + block(x)`) also gets the patch's change added to its output, so
  that the parent's sum carries it. Which kind of block it is, is read from one forward: the next
  block's input is either this block's output or its input plus its output.
A part it cannot find is one line naming what it looked for.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from models.layout import find_layout
from models.tap import TapError, logits_of, tap_forward
from models.tap_inputs import forward_inputs
from probes.common import ProbeInputError
from probes.patching.hooked import EditingEngine, Edits

CLOSE = 1e-5  # of the residual's scale: how near the next block's input must be to a candidate


@dataclass
class Parts:
    attention: list[str]  # the attention module of each layer
    n_heads: int
    projections: list[str | None]  # the Linear reading each layer's heads
    blocks: list[str]
    mlps: list[str | None]
    delta_blocks: bool | None  # blocks return a delta their parent adds (None: not known)
    d_vocab: int


_PARTS: "weakref.WeakKeyDictionary[nn.Module, Parts]" = weakref.WeakKeyDictionary()


def first(output: Any) -> torch.Tensor:
    return output[0] if isinstance(output, (tuple, list)) else output


def is_projection(module: nn.Module) -> bool:
    """A leaf module multiplying by a weight matrix: nn.Linear, GPT-2's Conv1D, ..."""
    weight = getattr(module, "weight", None)
    return not list(module.children()) and isinstance(weight, torch.Tensor) and weight.dim() == 2 \
        and not isinstance(module, nn.Embedding)


def is_norm(module: nn.Module) -> bool:
    return "norm" in type(module).__name__.lower()


def find_parts(model: nn.Module, ids: torch.Tensor) -> Parts:
    """The modules patching reads, from one tapped forward and one watched forward on ids."""
    if model in _PARTS:
        return _PARTS[model]
    try:
        tapped = tap_forward(model, ids, lambda call: None)
    except TapError as err:
        raise ProbeInputError(f"cannot patch {type(model).__name__}: {err}") from None
    names = [name for name, _ in tapped.layers]
    if len(set(tapped.n_heads)) != 1:
        raise ProbeInputError(f"{type(model).__name__}'s layers have different numbers of heads {tapped.n_heads}: "
                              "patching lays them out in one grid")
    n_heads = tapped.n_heads[0]
    blocks = find_layout(model, ids).blocks
    modules = dict(model.named_modules())
    calls: list[tuple[str, int]] = []  # (projection name, its input's width), in call order
    seen: dict[str, tuple[torch.Tensor, Any]] = {}  # block (or child) name -> (input, output)
    def called(name: str):
        def hook(module, args) -> None:
            if args and isinstance(args[0], torch.Tensor):
                calls.append((name, args[0].shape[-1]))
        return hook

    def ran(name: str):
        def hook(module, args, output) -> None:
            seen.setdefault(name, (args[0] if args else None, output))
        return hook
    handles = [m.register_forward_pre_hook(called(n)) for n, m in modules.items() if is_projection(m)]
    parents = [a.rsplit(".", 1)[0] for a in names]  # where each attention sits beside its MLP and norms
    watched = blocks + [f"{p}.{c}" for p in parents if p in modules for c, _ in modules[p].named_children()]
    handles += [modules[n].register_forward_hook(ran(n)) for n in watched]
    try:
        with torch.no_grad():
            logits = logits_of(model(ids, **forward_inputs(model, ids)))
    finally:
        for handle in handles:
            handle.remove()
    projections = [next((n for n, width in reversed(calls) if n.startswith(f"{a}.") and width % n_heads == 0), None)
                   for a in names]
    mlps = [mlp_of(modules, attn, seen) for attn in names]
    parts = Parts(names, n_heads, projections, blocks, mlps, delta_style(blocks, seen), int(logits.shape[-1]))
    _PARTS[model] = parts
    return parts


def mlp_of(modules: dict, attention: str, seen: dict) -> str | None:
    """The sibling of the attention module (a child of the module holding it) with the most
    parameters, called in the forward, that is not a norm."""
    parent = attention.rsplit(".", 1)[0]
    if "." not in attention or parent not in modules:
        return None
    children = [(f"{parent}.{c}", m) for c, m in modules[parent].named_children()]
    candidates = [(sum(p.numel() for p in m.parameters()), n) for n, m in children
                  if n in seen and n != attention and not is_norm(m)]
    return max(candidates)[1] if candidates else None


def delta_style(blocks: list[str], seen: dict) -> bool | None:
    """True if each block returns a delta the parent adds, False if it returns the residual itself."""
    if len(blocks) < 2 or blocks[0] not in seen or blocks[1] not in seen:
        return None
    x0, out0 = seen[blocks[0]][0], first(seen[blocks[0]][1])
    x1 = seen[blocks[1]][0]
    scale = float(x1.abs().max()) or 1.0
    if x1.shape == out0.shape and float((x1 - out0).abs().max()) <= CLOSE * scale:
        return False
    if x1.shape == out0.shape and float((x1 - x0 - out0).abs().max()) <= CLOSE * scale:
        return True
    return None


class TapEngine(EditingEngine):
    def __init__(self, model: nn.Module, what: str, ids: torch.Tensor):
        self.model, self.what = model, what
        self.parts = parts = find_parts(model, ids)
        self.n_layers = len(parts.attention)
        self.modules = dict(model.named_modules())
        where = {"heads": parts.projections, "attn": parts.attention, "resid": parts.blocks, "mlp": parts.mlps}[what]
        missing = next((l for l in range(self.n_layers) if l >= len(where) or where[l] is None), None)
        if missing is not None:
            raise ProbeInputError(f"cannot patch {what} of {type(model).__name__}: {self.why(what, missing)}")
        if what == "resid" and parts.delta_blocks is None:
            raise ProbeInputError(f"cannot patch the residual stream of {type(model).__name__}: the input of "
                                  f"{parts.blocks[1] if len(parts.blocks) > 1 else 'a second block'} is neither the "
                                  "block before's output nor its input plus its output")
        self.where = where

    def why(self, what: str, layer: int) -> str:
        attn = self.parts.attention[layer]
        if what == "heads":
            return (f"no projection (nn.Linear) called inside {attn} takes its {self.parts.n_heads} heads' outputs "
                    "(an output projection called as a function, as nn.MultiheadAttention's, cannot be read)")
        if what == "mlp":
            return f"no module beside {attn} (other than norms) was called"
        return f"no block was found for layer {layer} ({attn})"

    def run(self, tokens: torch.Tensor, edits: Edits) -> torch.Tensor:
        fired: set[int] = set()
        handles = [self.hook(l, edit, fired) for l, edit in edits.items()]
        handles = [h for pair in handles for h in pair]
        try:
            logits = logits_of(self.model(tokens, **forward_inputs(self.model, tokens)))
        finally:
            for handle in handles:
                handle.remove()
        if fired != set(edits):
            l = min(set(edits) - fired)
            raise ProbeInputError(f"{self.where[l]} was not called in {type(self.model).__name__}'s forward: "
                                  f"cannot patch {self.what} there")
        return logits

    def hook(self, layer: int, edit: Any, fired: set[int]) -> list:
        module = self.modules[self.where[layer]]
        if self.what in ("attn", "mlp"):
            def after(m, args, output):
                fired.add(layer)
                new = edit(first(output))
                return (new, *output[1:]) if isinstance(output, tuple) else new
            return [module.register_forward_hook(after)]
        n_heads, change = self.parts.n_heads, {}

        def before(m, args):
            fired.add(layer)
            x = args[0]
            if self.what == "heads":  # [batch pos head*d_head] -> the edit sees [batch pos head d_head]
                return (edit(x.unflatten(-1, (n_heads, -1))).flatten(-2), *args[1:])
            new = edit(x)
            change[0] = new - x
            return (new, *args[1:])
        handles = [module.register_forward_pre_hook(before)]
        if self.what == "resid" and self.parts.delta_blocks:
            def carry(m, args, output):  # the parent adds the block's output to its own x: carry the change
                return (first(output) + change[0], *output[1:]) if isinstance(output, tuple) else output + change[0]
            handles.append(module.register_forward_hook(carry))
        return handles
