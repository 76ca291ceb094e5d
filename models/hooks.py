"""Hook naming: series module paths for parameters, TransformerLens names for hook points."""

from __future__ import annotations

from transformer_lens import HookedRootModule

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
