"""The Monitor's internals on a model the store cannot rebuild as ours (nanochat's GPT, a Hugging
Face Llama, a tutorial GPT): one no-grad, eval-mode forward of the module itself on the eval
tokens, read by the attention tap (`models.tap`) and a few forward hooks.

- attn_entropy / attn_logit_max {layer: [per head]}: from each attention call the tap reads, the
  same reductions as our hooked models' (`train.data.forward_stats`);
- resid_rms {layer: rms}: the residual stream after each block, the children of the model's main
  ModuleList (or Sequential) of blocks: its output, or input + output for a block that returns
  what its parent adds (`models.stream`);
- logit_max: the largest |logit| at the unembedding module's output (`lm_head`, `out_head`, ...),
  before any softcap the model applies after it (nanochat's 15 tanh(x / 15));
- activations {module: {dead, saturated, ...}}: where the non-linearity is a module
  (nn.ReLU / GELU / Tanh, Hugging Face's GELU activations); a functional one (nanochat's relu²)
  and a SiLU gate (Llama's, which passes gradient below zero) are said not measured, and a model
  with no non-linearity in its forward (attention only) is said to have no MLP.

`plan(model)` finds those modules once; `measure(plan, tokens)` is one eval step's record;
`dims(...)` is what run.json's `model` says of the model, from the first forward.
"""

from __future__ import annotations

import logging
import math
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from models.layout import FUNCTION_NORMS, UNEMBED_NAMES, main_blocks, unembedding
from models.stream import StreamReader
from models.tap import TapError, eval_pass, logits_of, tap_forward
from models.tap_inputs import context_of, forward_inputs
from probes.activations import LayerStats, compact_row
from probes.entropy import series_entropy
from probes.thresholds import SATURATION
from train.host_copy import HostCopy

log = logging.getLogger("train.monitor")

__all__ = ["Plan", "dims", "measure", "plan", "read_model"]

ACTIVATIONS = {nn.ReLU: "relu", nn.GELU: "gelu", nn.SiLU: "silu", nn.Tanh: "tanh"}
# Hugging Face's activation modules (transformers.activations), by class name: act_fn -> names
HF_ACTIVATIONS = {"gelu": ("GELUActivation", "NewGELUActivation", "FastGELUActivation", "GELUTanh",
                           "PytorchGELUTanh", "AccurateGELUActivation"), "silu": ("SiLUActivation",)}


NONLINEAR = {F.relu, F.relu_, F.gelu, F.silu, F.tanh, F.sigmoid, F.leaky_relu, F.elu, F.mish, F.softplus, F.glu,
             torch.relu, torch.relu_, torch.tanh, torch.sigmoid, torch.Tensor.relu, torch.Tensor.tanh,
             torch.Tensor.sigmoid}  # what an MLP calls (softmax is attention's)


def act_fn_of(module: nn.Module) -> str | None:
    """relu / gelu / silu / tanh for a non-linearity module our dead-unit rules know, else None."""
    kind = next((a for t, a in ACTIVATIONS.items() if type(module) is t), None)
    name = type(module).__name__
    return kind or next((a for a, names in HF_ACTIVATIONS.items() if name in names), None)


@dataclass
class Plan:
    model: nn.Module
    blocks: list[tuple[str, nn.Module]]  # the residual stream's blocks, in order
    unembed: tuple[str, nn.Module] | None
    activations: list[tuple[str, nn.Module, str]]  # (name, module, act_fn)
    silu: bool = False  # SiLU modules, left unmeasured
    resid: bool = True  # one block per attention layer (records must fit run.json's n_layers)
    tap_error: str | None = None  # why the tap read nothing, once known
    trusted: Any = None  # the tap's checked first pass (`dims`): later passes read their calls the same way
    end: nn.Module | None = None  # what reads the last block's stream (`stream_end`)
    delta: bool = False  # its blocks return what their parent adds: found by the first, checked forward


def plan(model: nn.Module) -> Plan:
    takes_ids_alone(model)
    # a SiLU gate (Llama's SwiGLU) passes gradient below zero and multiplies a signed up-projection:
    # "never positive" is not dead there, so only relu / gelu / tanh units are counted
    acts = [(n, m, a) for n, m in model.named_modules() if (a := act_fn_of(m)) and a != "silu"]
    return Plan(model, main_blocks(model), unembedding(model), acts,
                silu=any(act_fn_of(m) == "silu" for m in model.modules()))


def takes_ids_alone(model: nn.Module) -> None:
    """The Monitor's eval step and its snapshots call model(ids): a forward that needs more (an
    attention_mask with no default) is refused at construction, not as a TypeError at the first step."""
    import inspect

    try:
        inspect.signature(model.forward).bind(None)
    except TypeError:
        needs = [n for n, p in list(inspect.signature(model.forward).parameters.items())[1:]
                 if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        raise ValueError(f"Monitor: the {type(model).__name__}'s forward needs {', '.join(needs) or 'more'} beside the "
                         "token ids; the Monitor reads it with model(ids) on eval_tokens: give it a default "
                         "(e.g. attention_mask=None)") from None
    except ValueError:  # no signature to read (a builtin): the first forward says what is wrong
        return


class Readings:
    """What the hooks and the tap read during the one forward, left on the device (the record's
    numbers come over in one transfer, `stats`); `windows` (a host read per layer) only when
    asked, for run.json."""

    def __init__(self, p: Plan, windows: bool = False):
        self.rms: dict[str, torch.Tensor] = {}
        self.logit_max: torch.Tensor | None = None
        self.vocab: int | None = None
        self.acts = {name: LayerStats(act, SATURATION, samples=False) for name, _, act in p.activations}
        self.d_model: int | None = None
        self.entropy: dict[str, torch.Tensor] = {}
        self.score_max: dict[str, torch.Tensor] = {}
        self.heads: list[int] = []
        self.find_windows = windows
        self.windows: dict[str, int] = {}

    def attention(self, call: Any) -> None:
        pattern, scores = call.pattern, call.scores  # [batch head q k] each, -inf where masked
        layer = str(call.layer)
        self.entropy[layer] = series_entropy(pattern.float())  # [head]
        self.score_max[layer] = scores.amax(dim=(0, 2, 3)).float()  # [head]
        self.heads.append(call.n_heads)
        if self.find_windows:
            seen = int((scores > -math.inf).sum(-1).amax())  # the most keys any query row sees
            if seen < scores.shape[-1]:
                self.windows[layer] = seen


def hooks(p: Plan, r: Readings) -> list[Any]:
    def on_unembed(module, args, output):  # [batch pos vocab] (nanochat pads it: cut after)
        if isinstance(output, torch.Tensor) and output.dim() >= 2:
            r.logit_max = output.detach().abs().flatten(0, -2).amax(0)  # [vocab]

    def on_act(name: str):
        return lambda module, args, output: r.acts[name].update(args[0].detach(), output.detach())

    handles = [p.unembed[1].register_forward_hook(on_unembed)] if p.unembed is not None else []
    handles += [m.register_forward_hook(on_act(n)) for n, m, _ in p.activations]
    return handles


def forward(p: Plan, tokens: torch.Tensor, autocast: Any = nullcontext, first: bool = False) -> Readings:
    """One no-grad eval forward of the model on tokens [batch pos], read by the tap and the hooks;
    the modules' modes are put back after. Where the tap reads nothing, a plain forward (once
    said). `first`: the forward that plans the run (`dims`): the tap checks there what it reads
    (which softmaxes are attention, its rebuilt SDPA attention against the output) and finds
    sliding windows; later forwards trust it (no host read)."""
    r = Readings(p, windows=first)
    handles = hooks(p, r)
    logits = None
    stream = StreamReader([m for _, m in p.blocks], p.end, None if first else p.delta)
    try:
        with autocast(), stream:
            if p.tap_error is None:
                try:
                    result = tap_forward(p.model, tokens, r.attention, trust=None if first else p.trusted)
                    logits = result.logits
                    if first:  # what later passes trust: its checks read values on the host
                        p.trusted = replace(result, layers=[], logits=None)
                except TapError as err:
                    p.tap_error = str(err)
                    log.info("monitor: attention entropy and attention logits are not measured: %s", err)
            else:
                logits = plain_forward(p.model, tokens)
    finally:
        for handle in handles:
            handle.remove()
    if logits is None:  # the tap read nothing: the plain forward from now on
        return forward(p, tokens, autocast, first)
    r.vocab = logits.shape[-1]
    if first:  # compared on the host once; later eval steps read the stream without a sync
        p.delta = stream.delta = stream.returns_delta()
    for i, x in enumerate(residuals(stream)):  # [batch pos d_model] after block i
        r.rms[str(i)], r.d_model = x.float().square().mean().sqrt(), x.shape[-1]
    # the unembedding's output, if it is the logits (nanochat pads them: its named lm_head may be wider)
    named = p.unembed is not None and p.unembed[0].rsplit(".", 1)[-1] in UNEMBED_NAMES
    seen = r.logit_max
    if seen is None or not (seen.shape[0] == r.vocab or (named and seen.shape[0] > r.vocab)):
        seen = logits.detach().abs().flatten(0, -2).amax(0)  # [vocab]
    r.logit_max = seen[:r.vocab].float().amax()  # padded vocabulary columns are not logits
    return r


def residuals(stream: StreamReader) -> list[torch.Tensor]:
    """The stream after each block; none where a block was not called with a tensor."""
    try:
        return stream.residuals()[1:]
    except ValueError:
        return []


def stream_end(model: nn.Module) -> nn.Module | None:
    """The module reading the last block's stream (`models.layout`): the final norm, or the
    unembedding where there is none; None where a function makes it (nanochat's) or it is not found."""
    from models.layout import layout_of
    try:
        layout = layout_of(model)
    except Exception:  # noqa: BLE001 - the model's own forward: the blocks' outputs are read then
        return None
    name = layout.unembedding if layout.final_norm == "none" else layout.final_norm
    return model.get_submodule(name) if name and name not in FUNCTION_NORMS else None


class NonlinearCalls(TorchFunctionMode):
    """Whether a forward called any non-linearity (a module's or a function's)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = False

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.seen = self.seen or func in NONLINEAR
        return func(*args, **(kwargs or {}))


def has_nonlinearity(model: nn.Module, tokens: torch.Tensor) -> bool:
    with NonlinearCalls() as calls, torch.no_grad():
        plain_forward(model, tokens)
    return calls.seen


def plain_forward(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    with eval_pass(model):
        return logits_of(model(tokens, **forward_inputs(model, tokens)))


def stats(p: Plan, r: Readings) -> HostCopy:
    """The record's internals, in the keys our models' records use: their transfer started, read
    with `.get()`."""
    tree: dict[str, Any] = {}
    if r.entropy:
        tree["attn_entropy"] = r.entropy
        tree["attn_logit_max"] = r.score_max
    if r.rms and p.resid:
        tree["resid_rms"] = r.rms
    tree["logit_max"] = r.logit_max
    acts = {name: s for name, s in r.acts.items() if s.ever_active is not None}
    if acts:
        tree["activations"] = {name: s.readings() for name, s in acts.items()}

    def finish(out: dict[str, Any]) -> dict[str, Any]:
        if "attn_entropy" in out:
            out["attn_entropy"] = {layer: [round(h, 6) for h in heads] for layer, heads in out["attn_entropy"].items()}
        if "activations" in out:
            out["activations"] = {name: compact_row(acts[name].summarize(host)) for name, host in out["activations"].items()}
        return out

    return HostCopy(tree, finish)


@torch.no_grad()
def measure(p: Plan, tokens: torch.Tensor, autocast: Any = nullcontext) -> HostCopy:
    """One eval step's internals of the planned model on tokens [batch pos] (on its device),
    measured there and sent to the host in one transfer: `.get()` is the record's internals."""
    return stats(p, forward(p, tokens, autocast))


@torch.no_grad()
def dims(p: Plan, tokens: torch.Tensor, autocast: Any = nullcontext) -> dict[str, Any]:
    """run.json's `model` from one forward on tokens: layers, heads, width, context (the eval rows'
    length: the entropy rules' uniform baseline), vocabulary, the activation, sliding windows seen."""
    device = next(p.model.parameters()).device
    r = forward(p, tokens.to(device), autocast, first=True)
    acts = sorted({a for _, _, a in p.activations} | ({"silu"} if p.silu else set()))
    model = p.model
    # a record's per-layer fields must fit n_layers and n_heads (models.store.record_check)
    p.resid = not r.heads or len(r.rms) == len(r.heads)
    out = {"family": "transformer" if r.heads else "other", "source": "tap", "class": type(model).__name__,
           "n_layers": len(r.heads) or len(p.blocks),
           "n_heads": r.heads[0] if r.heads and len(set(r.heads)) == 1 else None,
           "d_model": r.d_model, "n_ctx": int(tokens.shape[1]), "d_vocab": r.vocab,
           "max_context": context_of(model),
           "act_fn": acts[0] if len(acts) == 1 else None,
           "blocks": [n for n, _ in p.blocks], "unembedding": p.unembed[0] if p.unembed else None}
    if r.windows:
        out["attn_windows"] = r.windows
    if r.heads and len(set(r.heads)) > 1:
        out["heads_per_layer"] = r.heads
    if not p.resid:
        out["resid_rms"] = (f"not measured: {len(r.rms)} blocks found ({', '.join(n for n, _ in p.blocks[:3])}"
                            f"{', ...' if len(p.blocks) > 3 else ''}) for {len(r.heads)} attention layers")
    if not p.activations:
        out["activations"] = ("not measured: a SiLU gate passes gradient below zero (no dead units to count)"
                              if p.silu else "not measured: the non-linearity is not a module (a function call)"
                              if has_nonlinearity(model, tokens.to(device)) else "not measured: no MLP (no "
                              "non-linearity in the forward: attention only)")
    if p.tap_error:
        out["attention"] = f"not measured: {p.tap_error}"
    return out


def read_model(model: nn.Module, eval_tokens: torch.Tensor, autocast: Any) -> tuple[Plan, dict[str, Any]]:
    """The blocks, unembedding and activations of a model the store cannot rebuild, and what
    run.json says of it (with each parameter's g/w/u group by the layout found), from one forward
    on `eval_tokens` [batch pos]; a failing forward is refused here, in one line."""
    found = plan(model)
    found.end = stream_end(model)
    try:
        described = dims(found, eval_tokens, autocast)
        described["parameter_groups"] = groups_by_layout(model, eval_tokens)
    except (IndexError, RuntimeError, ValueError) as err:  # ids it cannot read (past its vocabulary or context)
        raise ValueError(f"Monitor: the {type(model).__name__} failed on eval_tokens of shape "
                         f"{list(eval_tokens.shape)}: {first_line(err)}") from None
    except Exception as err:  # noqa: BLE001 - their forward's own error (a TypeError on a None it needs)
        raise ValueError(f"Monitor: the {type(model).__name__} failed on eval_tokens of shape {list(eval_tokens.shape)}: "
                         f"its forward raised {type(err).__name__}: {first_line(err)} when called as model(ids) "
                         "(eval mode, no_grad): make it work on the ids alone (build what it needs where an "
                         "argument is None, e.g. attention_mask = torch.ones_like(ids)), or give the Monitor a "
                         "module whose forward(ids) calls yours with its inputs") from None
    return found, described


def first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def groups_by_layout(model: nn.Module, eval_tokens: torch.Tensor) -> dict[str, str]:
    """Each parameter's g/w/u group from the layout found (`probes.update_parts.groups`); {} where it
    cannot be found, as where the tap reads no attention (the name patterns judge then)."""
    from probes.update_parts.groups import parameter_groups
    try:
        return parameter_groups(model, eval_tokens.to(next(model.parameters()).device))
    except (ValueError, RuntimeError, IndexError) as err:  # TapError is a ValueError
        logging.getLogger("train.monitor").info("parameter groups by name only: %s", err)
        return {}
