"""Reading and writing checkpoints: one module per format behind one detecting ``load_checkpoint``.

    from models.store import load_checkpoint, save_snapshot
    snap = load_checkpoint("out-shakespeare-char/ckpt.pt")   # -> Snapshot(model, tokenizer, ...)

Formats: our snapshot directory (:mod:`.snapshot`) and run directory (:mod:`.run`), the series'
``.pt`` state dict (:mod:`.series`), nanoGPT's ``ckpt.pt`` (:mod:`.nanogpt`), a Hugging Face
GPT-2 directory (:mod:`.hf`), any other Hugging Face causal LM read through TransformerBridge
(:mod:`.bridge`) and nanochat's checkpoints built by nanochat's own code (:mod:`.nanochat`);
:mod:`.load` detects which, :mod:`.weights` builds and loads our
model once a format has its config and state dict, :mod:`.result` is the one :class:`Snapshot`;
:mod:`.peek` reads any format's config, step and format name without building the model
(`from models.store.peek import peek`: the function shares its module's name).
Names load on first use (PEP 562): the torch-free parts (run directories, durable writes) stay
importable without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "CheckpointError": "files", "Snapshot": "result", "load_checkpoint": "load",
    "load_snapshot": "snapshot", "save_snapshot": "snapshot", "load_optimizer_state": "snapshot",
    "load_series_state_dict": "series", "load_nanogpt": "nanogpt", "load_hf_gpt2": "hf",
    "load_hf_bridge": "bridge", "load_nanochat": "nanochat",
    "is_run_dir": "run", "is_snapshot_dir": "run", "list_snapshots": "run", "latest_snapshot": "run",
    "snapshot_name": "run", "snapshot_step": "run", "read_metrics": "run", "append_metrics": "run",
    "read_run_json": "run", "write_run_json": "run",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"models.store.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'models.store' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
