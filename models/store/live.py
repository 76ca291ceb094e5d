"""A live model in training (ours, nanoGPT's `GPT`, a Hugging Face `GPT2LMHeadModel`) seen as our
hooked Transformer, so that the probes can measure it while someone else's loop trains it.

`hooked_twin(model)` builds our model over the live model's *current* tensors: nothing is copied
(a GPT-2 layout's ``c_attn`` is already our packed ``W_QKV``, see :mod:`models.store.gpt2_layout`)
and nothing of the user's model changes; call it again after the optimizer has stepped and the
twin holds the new weights. `describe(model)` says what kind of model it is, for run.json.
"""

from __future__ import annotations

from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import torch

from models.config import MLPConfig, TransformerConfig
from models.store.files import CheckpointError
from models.store.gpt2_layout import gpt2_config, is_tied, our_state, without_buffers
from models.store.weights import build_and_load, strip_prefixes

__all__ = ["hooked_twin", "model_kind", "twin_config", "unwrap"]

NANOGPT_ARGS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "bias")


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module under DistributedDataParallel (`.module`) and torch.compile (`._orig_mod`)."""
    while True:
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner


def _config_dict(config: Any) -> dict[str, Any]:
    if isinstance(config, dict):
        return config
    if hasattr(config, "to_dict"):  # transformers' PretrainedConfig (a dataclass in 5.x, whose
        return config.to_dict()     # asdict would lose the class attribute model_type)
    if is_dataclass(config):
        return asdict(config)
    return dict(vars(config))


def model_kind(model: torch.nn.Module) -> str:
    """'ours' | 'nanogpt' | 'hf_gpt2' | 'other' (a model the probes cannot read as ours)."""
    model = unwrap(model)
    if isinstance(getattr(model, "cfg", None), (TransformerConfig, MLPConfig)):
        return "ours"
    config = getattr(model, "config", None)
    if config is None:
        return "other"
    data = _config_dict(config)
    if data.get("model_type") == "gpt2" and hasattr(model, "transformer"):
        return "hf_gpt2"
    if all(k in data for k in NANOGPT_ARGS) and hasattr(model, "transformer") and hasattr(model, "lm_head"):
        return "nanogpt"
    return "other"


def twin_config(model: torch.nn.Module) -> TransformerConfig | MLPConfig | None:
    """Our config for the live model (None for a kind the store does not read)."""
    model = unwrap(model)
    kind = model_kind(model)
    if kind == "ours":
        return model.cfg
    if kind == "other":
        return None
    from models.store.hf import _read_config
    from models.store.nanogpt import _dims

    data = _config_dict(model.config)
    if kind == "hf_gpt2":
        dims, act_fn, tied, eps, scale = _read_config(data, Path("model.config"))
        return gpt2_config(dims, act_fn=act_fn, tied=tied, eps=eps, attn_scale=scale)
    dims, _ = _dims(data, Path("model.config"))
    return gpt2_config(dims, act_fn="gelu", tied=is_tied(_source_state(model, kind)))


def _source_state(model: torch.nn.Module, kind: str) -> dict[str, torch.Tensor]:
    """The live model's tensors in GPT-2's names (detached views, no copies)."""
    state = without_buffers(strip_prefixes(model.state_dict(keep_vars=False)))
    if kind == "hf_gpt2":
        from models.store.hf import _prefixed
        state = _prefixed(state)
    return state


def shares_memory(twin: torch.nn.Module, model: torch.nn.Module) -> bool:
    """Whether every parameter and buffer of `twin` lies in the storage of one of `model`'s."""
    held = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    return all(t.untyped_storage().data_ptr() in held for t in (*twin.parameters(), *twin.buffers()))


def hooked_twin(model: torch.nn.Module, config: Any = None, cached: torch.nn.Module | None = None,
                ) -> torch.nn.Module | None:
    """Our hooked model over `model`'s current weights (itself when it is ours), in eval mode;
    None for a model the store does not read. `config`: `twin_config(model)`, when known.
    `cached`: a twin this gave for `model` before, given back as it is while every one of its
    tensors still sits in the memory of one of `model`'s (views of them: an optimizer's in-place
    step is seen; `.to()` or a new parameter is not, and a new twin is built then)."""
    model = unwrap(model)
    kind = model_kind(model)
    if kind in ("ours", "other"):
        return model if kind == "ours" else None
    if cached is not None and shares_memory(cached, model):
        return cached.eval()
    config = config or twin_config(model)
    state = _source_state(model, kind)
    try:
        twin = build_and_load(config, our_state(state, config, conv1d=kind == "hf_gpt2"),
                              Path(f"{type(model).__name__} (live)"), exact_names=True)
    except KeyError as missing:
        raise CheckpointError(f"{type(model).__name__}: tensor {missing} is missing: not the "
                              f"{kind} layout its config names") from None
    return twin.eval()
