"""Hook naming: series module paths for parameters, TransformerLens names for hook points."""

from __future__ import annotations

import weakref

import torch
from torch import nn
from torch.nn.modules import module as nn_module
from torch.utils.hooks import RemovableHandle
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

# series module name -> TransformerLens module name, applied to each dotted path segment
TL_SEGMENT_NAMES = {"attention": "attn", "rms1": "ln1", "rms2": "ln2"}


def tl_hook_name(module_path: str) -> str:
    """'blocks.0.attention.hook_q' -> 'blocks.0.attn.hook_q'; 'blocks.1.rms1.hook_scale' -> ln1."""
    return ".".join(TL_SEGMENT_NAMES.get(part, part) for part in module_path.split("."))


def rename_hooks_to_tl(root: HookedRootModule) -> None:
    """After `setup()`: give every HookPoint its TransformerLens name in hook_dict and mod_dict."""
    for name, hook in list(root.hook_dict.items()):
        tl_name = tl_hook_name(name)
        if tl_name != name:
            del root.hook_dict[name], root.mod_dict[name]
            hook.name = tl_name
            root.hook_dict[tl_name] = root.mod_dict[tl_name] = hook


# torch registers global module hooks into these dicts in place, so binding them once is safe
_GLOBAL_FWD = nn_module._global_forward_hooks
_GLOBAL_FWD_PRE = nn_module._global_forward_pre_hooks
_GLOBAL_BWD = nn_module._global_backward_hooks
_GLOBAL_BWD_PRE = nn_module._global_backward_pre_hooks


def is_hooked(hook: HookPoint) -> bool:
    """True if anything (TransformerLens, a plain torch hook, a global module hook) observes it."""
    return bool(hook._forward_hooks or hook._forward_pre_hooks or hook._backward_hooks
                or hook._backward_pre_hooks or _GLOBAL_FWD or _GLOBAL_FWD_PRE or _GLOBAL_BWD
                or _GLOBAL_BWD_PRE)


def fire(hook: HookPoint, x: torch.Tensor) -> torch.Tensor:
    """`hook(x)` when something observes the hook point, else `x` untouched: an unobserved
    HookPoint is an identity, and skipping its module call keeps a small model's forward as
    fast as a plain module's (a call costs microseconds; a block has a dozen hook points)."""
    return hook(x) if is_hooked(hook) else x


def passthrough(hook: HookPoint, x: torch.Tensor) -> torch.Tensor:
    """`fire` on a forward that `unobserved` cleared: no hook point to ask, `x` itself."""
    return x


# model -> RemovableHandle.next_id when a scan found no hook on it. Every hook torch registers
# (module, global, TransformerLens' add_hook) takes a handle from that one counter, so while it
# has not moved no hook was added since: no scan. A dict beside the model, not on it, so that
# copies and pickles of a model never carry a stale answer.
_UNOBSERVED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def unobserved(model: nn.Module) -> bool:
    """True when no module of `model` has a forward or backward hook and no global module hook is
    set: nothing can see inside its forward, so hook points and per-layer guards may be skipped
    (one decision per forward). False while torch.compile traces (its per-layer checks are free
    there and dynamo may guard on them)."""
    if torch.compiler.is_compiling():
        return False
    stamp = RemovableHandle.next_id
    if _UNOBSERVED.get(model) == stamp:
        return True
    if _GLOBAL_FWD or _GLOBAL_FWD_PRE or _GLOBAL_BWD or _GLOBAL_BWD_PRE or any(
            m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
            for m in model.modules()):
        _UNOBSERVED.pop(model, None)
        return False
    _UNOBSERVED[model] = stamp
    return True
