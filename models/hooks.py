"""Hook naming: series module paths for parameters, TransformerLens names for hook points."""

from __future__ import annotations

import torch
from torch.nn.modules import module as nn_module
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
