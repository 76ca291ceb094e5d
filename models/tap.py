"""The attention tap: every attention computation of one forward pass, read at the function level,
whatever module makes it (our models, Hugging Face, nanochat, the GPTs tutorials write).

    from models.tap import tap_forward
    result = tap_forward(model, ids, lambda call: call.pattern.amax(-1).mean())  # ids: [batch pos]
    result.layers   # [(module name, reduced value), ...] in layer order
    result.logits   # the model's logits [batch pos vocab]

What is read, under a `TorchFunctionMode` for the one forward pass (no function is patched, but
for the one below `nn.MultiheadAttention`):
- `torch.nn.functional.scaled_dot_product_attention` (the same object as
  `torch._C._nn.scaled_dot_product_attention`): the pattern is rebuilt from the call's own
  arguments (`models.tap_rebuild`) and `pattern @ v` is checked against the call's real output
  (on up to 128 evenly spread query rows); a mismatch raises `TapError`. `dropout_p` is set to 0 for the call (the tap reads an eval pass).
- an explicit softmax over the keys (`torch.softmax`, `F.softmax`, `Tensor.softmax`, so
  `nn.Softmax` too) with dim -1 over `[batch head q k]` (or `[batch*head q k]`, heads folded
  batch-major into the batch), or over `[batch q k]` from one module per head, where q and k are
  the ids' length, and whose output is 0 on every key after its query (a causal mask: a
  router's softmax over as many experts as there are ids is not attention, and is not read).
  Per-head calls made by sibling modules under one caller (`blocks.0.att.heads.0`, `.1`, ...
  called by `blocks.0.att`) are stacked in call order into one layer named by the caller.
- `nn.MultiheadAttention` (its `F.multi_head_attention_forward` runs as one call under the mode,
  so its own SDPA or softmax over [batch*head q k] is swapped for a reader during that call).

Each layer reaches `reduce(call: AttentionCall) -> Any` inside the forward pass, with its name
(the qualified name, from `named_modules`, of the module running the call), its number in call
order, its pattern and its pre-softmax scores (both `[batch head q k]`, -inf where masked), so
memory stays at one layer's attention. `reduce` may raise `StopTap` to end the forward pass early
(the layers reduced before it are kept, `logits` is None then).

The model is left as it was: eval mode and no_grad for the pass, each module's mode put back,
every hook removed, also when the pass raises. A forward that made no call the tap can read
(FlashAttention kernels, flex attention, a `torch.compile`d model, a model without attention)
raises `TapError` in one line naming what to switch.

Public API:
- `tap_forward(model, ids, reduce=None, trust=None) -> TapResult` (default reduce: keep each pattern);
- `AttentionCall(module, layer, pattern, scores, n_heads, kind)`, kind "sdpa", "softmax" (batched
  heads) or "heads" (one module per head, stacked);
- `TapResult(layers, logits, n_heads, kinds, seq_len, softmax_reads)`: `layers` [(module name,
  reduced value)] in layer order, `n_heads` / `kinds` per layer, `logits` None after a StopTap,
  `softmax_reads` whether each softmax over [.. ids ids] was read as attention (what `trust` reuses);
- `TapError` (a ValueError: one line), `StopTap` (raised by reduce to end the pass);
- `logits_of(output)`: the logits in a tensor, `.logits`, a dict's "logits" or a tuple's first item;
- `eval_pass(model)`: the context manager the pass runs in (eval mode and no_grad, each module's
  mode put back after);
The forward is called as `model(ids, **forward_inputs(model, ids))` (`models.tap_inputs`: an
`attention_mask` of ones where the forward requires one; any other required argument refused).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from models.tap_inputs import forward_inputs
from models.tap_rebuild import TapError, check_output, sdpa_arguments, sdpa_scores, softmax_scores

log = logging.getLogger(__name__)

__all__ = ["AttentionCall", "TapResult", "TapError", "StopTap", "tap_forward", "logits_of"]

SDPA = F.scaled_dot_product_attention
MHA = F.multi_head_attention_forward
SOFTMAXES = (torch.softmax, F.softmax, torch.Tensor.softmax)

@dataclass
class AttentionCall:
    module: str  # qualified name of the module running the call ("" for the root)
    layer: int  # 0, 1, ... in call order
    pattern: torch.Tensor  # [batch head q k]
    scores: torch.Tensor  # [batch head q k], -inf where masked
    n_heads: int
    kind: str = "sdpa"  # "sdpa" | "softmax" (batched heads) | "heads" (one module per head)


@dataclass
class TapResult:
    layers: list[tuple[str, Any]] = field(default_factory=list)  # (module name, reduced value)
    logits: torch.Tensor | None = None
    n_heads: list[int] = field(default_factory=list)  # per layer
    kinds: list[str] = field(default_factory=list)  # per layer: "sdpa" | "softmax" | "heads"
    seq_len: int = 0
    softmax_reads: list[bool] = field(default_factory=list)  # per softmax of [.. ids ids]: read as attention?


class StopTap(Exception):
    """Raised by a `reduce` callback once it has what it needs: the forward pass ends there."""


def logits_of(output: Any) -> torch.Tensor:
    """The logits in a model's output: a tensor, an object with `.logits` (Hugging Face), a dict
    with "logits", or a tuple / list whose first item is the logits (a tutorial's (logits, loss))."""
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if logits is None and isinstance(output, dict):
        logits = output.get("logits")
    if logits is None and isinstance(output, (tuple, list)) and output:
        logits = output[0]
    if not isinstance(logits, torch.Tensor):
        raise TapError(f"the model returned {type(output).__name__}, not logits: give a module whose output is "
                       "the logits, an object with .logits, or a tuple whose first item is the logits")
    return logits


class _Reader:
    """One forward pass's state: the module stack, pending per-head calls, the layers reduced."""

    def __init__(self, reduce: Callable[[AttentionCall], Any], batch: int, seq_len: int,
                 trust: TapResult | None = None):
        self.reduce, self.batch, self.seq_len, self.trust = reduce, batch, seq_len, trust
        self.stack: list[str] = []
        self.pending: list[tuple[str, str, torch.Tensor, torch.Tensor]] = []  # (caller, module, p, scores)
        self.result = TapResult(seq_len=seq_len)
        self.calls = 0  # layers handed to reduce, the one that stopped the pass included

    def emit(self, name: str, pattern: torch.Tensor, scores: torch.Tensor, kind: str) -> None:
        layer = len(self.result.layers)
        self.calls += 1
        value = self.reduce(AttentionCall(name, layer, pattern, scores, pattern.shape[1], kind))
        self.result.layers.append((name, value))  # a layer whose reduce raised StopTap is left out
        self.result.n_heads.append(pattern.shape[1])
        self.result.kinds.append(kind)

    def flush(self) -> None:
        """Stack the pending per-head calls into one layer."""
        if not self.pending:
            return
        caller = self.pending[0][0]
        pattern = torch.stack([p for _, _, p, _ in self.pending], dim=1)  # [batch head q k]
        scores = torch.stack([s for _, _, _, s in self.pending], dim=1)
        self.pending = []
        self.emit(caller, pattern, scores, "heads")

    def is_attention(self, out: torch.Tensor) -> bool:
        """`masks_later_keys`, or the answer the trusted pass gave for this softmax (in call order)."""
        reads, trusted = self.result.softmax_reads, self.trust.softmax_reads if self.trust else []
        reads.append(trusted[len(reads)] if len(reads) < len(trusted) else masks_later_keys(out))
        return reads[-1]

    def current(self) -> str:
        return self.stack[-1] if self.stack else ""

    def sdpa(self, args: tuple, kwargs: dict, out: torch.Tensor) -> None:
        self.flush()
        where = self.current() or "the model"
        a = sdpa_arguments(args, kwargs)
        scores = sdpa_scores(a)  # [batch head q k]
        pattern = torch.softmax(scores, dim=-1)
        if self.trust is None:
            check_output(pattern, a, out, where)
        self.emit(self.current(), pattern, scores, "sdpa")

    def softmax(self, args: tuple, kwargs: dict, out: torch.Tensor) -> None:
        x = args[0] if args else kwargs.get("input")
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        if not isinstance(x, torch.Tensor) or dim is None or x.dim() not in (3, 4):
            return
        if dim % x.dim() != x.dim() - 1 or tuple(x.shape[-2:]) != (self.seq_len, self.seq_len):
            return
        if not x.dtype.is_floating_point or not self.is_attention(out):
            return
        pattern = out if out.dtype in (torch.float32, torch.float64) else out.float()
        scores = softmax_scores(x)
        if x.dim() == 3 and x.shape[0] != self.batch and x.shape[0] % self.batch == 0:
            shape = (self.batch, x.shape[0] // self.batch, *x.shape[1:])  # heads folded into the batch
            pattern, scores = pattern.reshape(shape), scores.reshape(shape)  # [batch head q k]
        if pattern.dim() == 4:
            self.flush()
            self.emit(self.current(), pattern, scores, "softmax")
            return
        module = self.current()
        caller = self.stack[-2] if len(self.stack) > 1 else ""
        if self.pending and (self.pending[0][0] != caller or any(m == module for _, m, _, _ in self.pending)):
            self.flush()
        self.pending.append((caller, module, pattern, scores))


def masks_later_keys(p: torch.Tensor) -> bool:
    """Is this softmax's output [.. q k] zero on every key after its query (NaN in a diverged
    model)? A causal language model's attention is; a router's softmax over experts, or any other
    softmax whose last two sizes happen to equal the ids' length, is not, and is left unread."""
    n = p.shape[-1]
    if n < 2:
        return True
    later = p[..., torch.ones(n, n, dtype=torch.bool, device=p.device).triu(1)]  # [.. later keys]
    return bool(((later == 0) | later.isnan()).all())


def without_dropout(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """An SDPA call's arguments with dropout_p 0 (positional or keyword): the tap reads an eval pass."""
    if len(args) > 4:
        return args[:4] + (0.0,) + tuple(args[5:]), kwargs
    return args, {**kwargs, "dropout_p": 0.0}


class _TapMode(TorchFunctionMode):
    def __init__(self, reader: _Reader):
        super().__init__()
        self.reader = reader

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is SDPA:
            args, kwargs = without_dropout(args, kwargs)
            out = func(*args, **kwargs)
            self.reader.sdpa(args, kwargs, out)
            return out
        if func is MHA:  # one call under the mode: its own SDPA / softmax are read inside it
            with inside_mha(self.reader, args[4] if len(args) > 4 else kwargs["num_heads"]):
                return func(*args, **kwargs)
        out = func(*args, **kwargs)
        if func in SOFTMAXES and isinstance(out, torch.Tensor):
            self.reader.softmax(args, kwargs, out)
        return out


@contextmanager
def inside_mha(reader: _Reader, n_heads: int) -> Iterator[None]:
    """`nn.MultiheadAttention`'s `F.multi_head_attention_forward` reaches the mode as one call and runs
    with it off; its SDPA (need_weights=False) or softmax over [batch*head q k] (need_weights=True)
    are looked up in torch.nn.functional's globals, so they are swapped for readers for the call."""
    real_sdpa, real_softmax = F.scaled_dot_product_attention, F.softmax

    def sdpa(*args, **kwargs):
        args, kwargs = without_dropout(args, kwargs)
        out = real_sdpa(*args, **kwargs)
        reader.sdpa(args, kwargs, out)
        return out

    def softmax(x, dim=None, *args, **kwargs):
        out = real_softmax(x, dim, *args, **kwargs)
        if x.dim() == 3 and dim in (-1, 2) and x.shape[0] % n_heads == 0:
            shape = (x.shape[0] // n_heads, n_heads, *x.shape[1:])  # [batch head q k]
            reader.flush()
            reader.emit(reader.current(), out.float().view(shape), softmax_scores(x).view(shape), "softmax")
        return out

    F.scaled_dot_product_attention, F.softmax = sdpa, softmax
    try:
        yield
    finally:
        F.scaled_dot_product_attention, F.softmax = real_sdpa, real_softmax


@contextmanager
def module_stack(model: torch.nn.Module, reader: _Reader) -> Iterator[None]:
    """Forward pre-hooks / hooks keeping `reader.stack` as the modules now running; removed after."""
    handles = []

    def enter(name: str):
        return lambda module, args: reader.stack.append(name)

    def leave(module, args, output):
        if reader.stack:
            reader.stack.pop()

    try:
        for name, module in model.named_modules():
            if isinstance(module, (torch.nn.Softmax, torch.nn.Dropout)):
                continue  # an nn.Softmax is part of the attention module that calls it
            handles.append(module.register_forward_pre_hook(enter(name)))
            handles.append(module.register_forward_hook(leave, always_call=True))
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def eval_pass(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode and no_grad inside; each module's own mode put back after."""
    modes = [(m, m.training) for m in model.modules()]
    modes = modes if any(training for _, training in modes) else []
    if modes:
        model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for module, mode in modes:
            module.training = mode


def refuse_unreadable(model: Any) -> None:
    """Kernels known before the pass: a compiled graph, a Hugging Face FlashAttention / flex model."""
    if hasattr(model, "_orig_mod") and type(model).__name__ == "OptimizedModule":
        raise TapError("a torch.compile'd model runs as one graph the tap cannot read: pass the model "
                       "before torch.compile (its ._orig_mod)")
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if isinstance(impl, str) and impl not in ("sdpa", "eager"):
        raise TapError(f"{type(model).__name__} runs attn_implementation {impl!r}, which the tap cannot "
                       "read: load it with attn_implementation=\"sdpa\" (or \"eager\")")


def nothing_read(model: Any, seq_len: int) -> TapError:
    """The one line for a forward that made no call the tap reads, naming what to switch."""
    if "nanochat" in type(model).__module__:
        return TapError("nanochat ran its FlashAttention 3 kernel, which the tap cannot read: take its SDPA "
                        "fallback (set nanochat.flash_attention.USE_FA3 = False for the reading, or run on CPU)")
    return TapError(f"{type(model).__name__}'s forward made no attention call the tap can read (no "
                    "scaled_dot_product_attention, no causally masked softmax over the keys of its "
                    f"{seq_len} tokens): a model without attention, or a FlashAttention / flex / compiled "
                    "kernel; switch to attn_implementation=\"sdpa\" or \"eager\", nanochat's SDPA fallback, or "
                    "the model before torch.compile")


def tap_forward(model: torch.nn.Module, ids: torch.Tensor, reduce: Callable[[AttentionCall], Any] | None = None,
                trust: TapResult | None = None) -> TapResult:
    """One no-grad, eval-mode forward of `model` on ids [batch pos], every attention layer handed to
    `reduce` (default: keep the pattern) as it is computed. Raises TapError where nothing is read.
    `trust`: the result of an earlier pass of this model on ids of this shape, whose calls are
    read as it read them, without the checks that read values on the host (each SDPA call's
    rebuilt pattern @ v against its output, which softmaxes mask later keys): the Monitor checks
    its first pass and trusts it at every eval step."""
    refuse_unreadable(model)
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        raise TapError(f"ids must be a [batch pos] tensor, got {getattr(ids, 'shape', type(ids).__name__)}")
    inputs = forward_inputs(model, ids)
    reader = _Reader(reduce or (lambda call: call.pattern), *ids.shape, trust=trust)
    stopped = False
    with eval_pass(model), module_stack(model, reader):
        try:
            with _TapMode(reader):
                output = model(ids, **inputs)
            reader.flush()
        except StopTap:
            stopped = True
        finally:
            reader.pending = []
    if not reader.calls:
        raise nothing_read(model, ids.shape[1])
    reader.result.logits = None if stopped else logits_of(output)
    return reader.result
