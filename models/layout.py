"""Where the parts of any language model sit, by their names in the module itself: the token and
position embedding tables, the blocks of the residual stream, the final norm and the unembedding.
What the Monitor records in a snapshot of a model the store cannot rebuild (a GPT a user wrote,
nanochat's), and what the lens and the neighbour tables read from such a model.

    layout = find_layout(model, ids)         # one eval, no-grad forward on ids [batch pos]
    layout.token_embedding, layout.blocks    # "tok_emb.weight", ["trf_blocks.0", "trf_blocks.1"]
    layout.missing                           # {"position_embedding": "no nn.Embedding read positions ..."}

Found from the module's structure and one forward (forward hooks only, all removed after):
- blocks: the children of the ModuleList / Sequential holding the most parameters whose children
  are all one class with children of their own (`main_blocks`);
- unembedding: the Linear named like `lm_head`, `out_head`, ... else the last Linear (`unembedding`);
- token embedding: the first `nn.Embedding` called on the ids themselves; position embedding: the
  first one called on positions 0..pos-1;
- final norm: what the unembedding reads, from the last block's output: the module whose output it
  is (`ln_f`, `final_norm`), "none" where it reads the last block's output itself, or a norm made
  by a function call (nanochat's `F.rms_norm`: "function:rms_norm", "function:layer_norm"),
  recognised by its output (each vector of rms 1, and of mean 0 for a layer norm).
A part not found is None, with one line in `missing` saying why.
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from models.tap import eval_pass, logits_of
from models.tap_inputs import forward_inputs

__all__ = ["Layout", "parameter_count", "FUNCTION_NORMS", "UNEMBED_NAMES", "find_layout", "first_tensor", "layout_of",
           "main_blocks",
           "unembedding"]

UNEMBED_NAMES = ("lm_head", "out_head", "head", "output", "embed_out", "unembed", "W_U")
FUNCTION_NORMS = ("function:rms_norm", "function:layer_norm")
NORM_TOLERANCE = 1e-3  # how near 1 (and 0) each vector's rms (and mean) must be to call it normed


@dataclass
class Layout:
    """Names in the model's own state dict (tables) and module tree (blocks, final norm)."""

    token_embedding: str | None = None  # weight [vocab d_model]
    position_embedding: str | None = None  # weight [context d_model]
    blocks: list[str] = field(default_factory=list)
    final_norm: str | None = None  # a module name, "none", or one of FUNCTION_NORMS
    unembedding: str | None = None  # the unembedding module's name (a Linear: weight [vocab d_model])
    unembedding_bias: bool = False
    d_vocab: int | None = None  # columns of the logits the forward returns (a padded table has more rows)
    tied: bool = False  # the unembedding's weight is the token embedding's
    missing: dict[str, str] = field(default_factory=dict)  # part -> why it was not found

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Layout:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def why_missing(self, part: str) -> str:
        return self.missing.get(part, f"no {part.replace('_', ' ')} was found")


def parameter_count(model: nn.Module) -> int:
    """Elements of the model's parameters, each table once. A live module's tied table is one
    Parameter under two names (counted once by `parameters()`); a snapshot of any model read without
    its code holds the tied unembedding as a copy of the token table, which its layout names
    `tied`: not counted again (a tied Llama's 340,128 read 347,808)."""
    params = dict(model.named_parameters())
    total = sum(p.numel() for p in params.values())
    layout = getattr(model, "layout", None)
    if isinstance(layout, Layout) and layout.tied and layout.unembedding and layout.token_embedding in params:
        copy = params.get(f"{layout.unembedding}.weight")
        if copy is not None and copy is not params[layout.token_embedding]:
            total -= copy.numel()
    return total


def main_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The children of the ModuleList / Sequential holding the most parameters whose children are
    all one class with children of their own (the blocks, not an MLP's Linear-act-Linear)."""
    best, best_size = [], 0
    for name, module in model.named_modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)) or not len(module):
            continue
        kids = list(module.named_children())
        if len({type(k) for _, k in kids}) != 1 or not list(kids[0][1].children()):
            continue
        size = sum(p.numel() for p in module.parameters())
        if size > best_size:
            best, best_size = [(f"{name}.{k}" if name else k, m) for k, m in kids], size
    return best


def unembedding(model: nn.Module) -> tuple[str, nn.Module] | None:
    """The module whose output is the logits before any cap: by its usual names, else the last Linear."""
    named = list(model.named_modules())
    for name, module in named:
        if name.rsplit(".", 1)[-1] in UNEMBED_NAMES and isinstance(module, nn.Linear):
            return name, module
    linears = [(n, m) for n, m in named if isinstance(m, nn.Linear)]
    return linears[-1] if linears else None


def first_tensor(output: Any) -> torch.Tensor | None:
    """A block's output: a tensor, or the first item of a tuple (Hugging Face's older layers)."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return None


class _Seen:
    """What the one forward showed: embeddings by what they read, outputs by identity."""

    def __init__(self) -> None:
        self.embeddings: list[tuple[str, torch.Tensor]] = []  # (module name, its ids) in call order
        self.outputs: list[tuple[str, torch.Tensor]] = []  # (module name, output) in return order
        self.unembed_input: torch.Tensor | None = None
        self.last_block: torch.Tensor | None = None


def _watch(model: nn.Module, blocks: list[tuple[str, nn.Module]], unembed: nn.Module | None, seen: _Seen) -> list:
    handles = []
    last = blocks[-1][1] if blocks else None
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding):
            handles.append(module.register_forward_pre_hook(
                lambda m, args, name=name: seen.embeddings.append((name, args[0]))))
        if name and not isinstance(module, (nn.Dropout, nn.Identity)):
            handles.append(module.register_forward_hook(
                lambda m, args, out, name=name: seen.outputs.append((name, out)) if isinstance(out, torch.Tensor)
                else None))
    if unembed is not None:
        handles.append(unembed.register_forward_pre_hook(
            lambda m, args: setattr(seen, "unembed_input", args[0] if args else None)))
    if last is not None:
        handles.append(last.register_forward_hook(
            lambda m, args, out: setattr(seen, "last_block", first_tensor(out))))
    return handles


def _is_positions(ids: Any, n: int) -> bool:
    if not isinstance(ids, torch.Tensor) or ids.dtype.is_floating_point or ids.shape[-1:] != (n,):
        return False
    return bool((ids.reshape(-1, n) == torch.arange(n, device=ids.device)).all())


def _final_norm(seen: _Seen, block_names: set[str], unembed_name: str) -> tuple[str | None, str | None]:
    """(final norm, why not found): what turned the last block's output into the unembedding's input."""
    u, last = seen.unembed_input, seen.last_block
    if u is None:
        return None, "the unembedding was not called in the forward"
    if last is not None and (u is last or (u.shape == last.shape and torch.equal(u, last))):
        return "none", None
    made = [(name, out) for name, out in seen.outputs if name not in block_names and name != unembed_name]
    for same in (lambda out: out is u, lambda out: out.shape == u.shape and torch.equal(out, u)):  # a slice: equal
        name = next((name for name, out in made if same(out)), None)
        if name is not None:
            return name, None
    x = u.float()
    rms = x.square().mean(-1).sqrt()
    if bool(((rms - 1).abs() < NORM_TOLERANCE).all()):
        centred = bool((x.mean(-1).abs() < NORM_TOLERANCE).all())
        return ("function:layer_norm" if centred else "function:rms_norm"), None
    return None, ("the unembedding reads what a function call made from the last block's output, and it is "
                  "not a norm without weights: the lens cannot recompute it")


@torch.no_grad()
def find_layout(model: nn.Module, ids: torch.Tensor) -> Layout:
    """The model's layout from its structure and one eval-mode, no-grad forward on ids [batch pos]
    (at least two positions: some models refuse one)."""
    layout = Layout()
    blocks = main_blocks(model)
    layout.blocks = [name for name, _ in blocks]
    if not blocks:
        layout.missing["blocks"] = "no ModuleList or Sequential of blocks was found"
    unembed = unembedding(model)
    seen = _Seen()
    handles = _watch(model, blocks, unembed[1] if unembed else None, seen)
    try:
        with eval_pass(model):
            vocab = logits_of(model(ids, **forward_inputs(model, ids))).shape[-1]
    finally:
        for handle in handles:
            handle.remove()
    n, layout.d_vocab = ids.shape[-1], vocab
    token = next((name for name, read in seen.embeddings if read is ids or
                  (isinstance(read, torch.Tensor) and read.shape == ids.shape and torch.equal(read, ids))), None)
    position = next((name for name, read in seen.embeddings if _is_positions(read, n)), None)
    if token is None:
        layout.missing["token_embedding"] = "no nn.Embedding read the token ids"
    else:
        layout.token_embedding = f"{token}.weight"
    if position is None:
        layout.missing["position_embedding"] = "no nn.Embedding read the positions (rotary positions, or none)"
    else:
        layout.position_embedding = f"{position}.weight"
    if unembed is None or unembed[1].weight.shape[0] < vocab:
        layout.missing["unembedding"] = (f"no Linear with at least {vocab} outputs (the vocabulary) was found"
                                         if unembed is None else f"{unembed[0]} has {unembed[1].weight.shape[0]} "
                                         f"outputs, fewer than the {vocab} logits")
        layout.missing["final_norm"] = "no unembedding, so no final norm before it"
        return layout
    layout.unembedding, layout.unembedding_bias = unembed[0], unembed[1].bias is not None
    if token is not None:
        layout.tied = unembed[1].weight is model.get_submodule(token).weight
    layout.final_norm, why = _final_norm(seen, set(layout.blocks), unembed[0])
    if why:
        layout.missing["final_norm"] = why
    return layout


_FOUND: "weakref.WeakKeyDictionary[nn.Module, Layout]" = weakref.WeakKeyDictionary()


def layout_of(model: nn.Module) -> Layout:
    """The layout a model carries (`model.layout`, a snapshot of any model's), else `find_layout` on
    two tokens of id 0, found once per model."""
    carried = getattr(model, "layout", None)
    if isinstance(carried, Layout):
        return carried
    if model not in _FOUND:
        param = next(iter(model.parameters()), None)
        device = param.device if param is not None else torch.device("cpu")
        _FOUND[model] = find_layout(model, torch.zeros(1, 2, dtype=torch.long, device=device))
    return _FOUND[model]
