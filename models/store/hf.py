"""Hugging Face GPT-2 directories (``save_pretrained``'s ``config.json`` with ``model_type: gpt2``
and ``model.safetensors`` or ``pytorch_model.bin``), becoming our Transformer.

A load reads top to bottom: the config (any other architecture is refused: TransformerLens loads
those), the weights (safetensors, or the ``.bin`` with ``torch.load(weights_only=True)``) checked
in Hugging Face's names, our model built and loaded, then the tokenizer from ``tokenizer.json``
or ``vocab.json`` + ``merges.txt`` when the directory has them. Nothing is downloaded.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from models.config import TransformerConfig
from models.gpt2_bpe import GPT2BPETokenizer, find_gpt2_files
from models.store.files import CheckpointError, read_json_object
from models.store.gpt2_layout import (GPT2Dims, check_layout, check_vocab_fits, gpt2_config, our_state,
                                      without_buffers)
from models.store.result import Snapshot
from models.store.snapshot import read_safetensors
from models.store.weights import build_and_load, torch_load
from models.tokenizers import TokenizerError

__all__ = ["HF_WEIGHTS", "hf_config", "is_hf_config", "load_hf_gpt2", "refuse_untyped"]

logger = logging.getLogger(__name__)

HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
# Hugging Face's activation names -> ours (gelu_new is the tanh approximation)
ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
               "gelu": "gelu", "relu": "relu", "tanh": "tanh"}


HF_KEYS = ("architectures", "transformers_version", "_name_or_path", "hidden_size", "num_hidden_layers",
           "n_embd", "n_layer", "vocab_size")  # keys of Hugging Face configs that ours never has at its top


def is_hf_config(data: dict[str, Any]) -> bool:
    """A Hugging Face config.json (ours has a format_version instead)."""
    return "model_type" in data and "format_version" not in data


def refuse_untyped(data: dict[str, Any], source: Path) -> None:
    """A config.json that is Hugging Face's (its keys say so) but names no model_type: one line
    saying that, not our snapshot's keys."""
    if "format_version" in data or "model_type" in data:
        return
    if any(key in data for key in HF_KEYS):
        raise CheckpointError(f"{source}: a Hugging Face config without model_type (transformers reads the "
                              "architecture from it; save_pretrained writes it): add \"model_type\" (e.g. "
                              "\"llama\") to config.json")


def load_hf_gpt2(directory: Path, data: dict[str, Any], device: str | torch.device = "cpu") -> Snapshot:
    """The GPT-2 directory whose config.json is `data`, as our model with its tokenizer."""
    source = directory / "config.json"
    dims, _, tied, _, _ = _read_config(data, source)
    config = hf_config(data, source)
    weights, state = _read_weights(directory)
    state = without_buffers(_prefixed(state))
    check_layout(state, dims, conv1d=True, lm_head="lm_head.weight" in state or not tied,
                 source=weights, said_by="config.json")
    model = build_and_load(config, our_state(state, config, conv1d=True), weights, exact_names=True,
                           described_by=source)
    tokenizer, hint = _tokenizer(directory, config.d_vocab)
    meta = {"format_version": None, "source": "huggingface", "model": config.to_dict(),
            "tokenizer": None if tokenizer is None else {"kind": tokenizer.kind, "files": list(tokenizer.files)},
            "step": None, "tokens_seen": None, "train_config": None, "tokenizer_hint": hint}
    return Snapshot(model.to(device).eval(), tokenizer, config, meta, directory)


def hf_config(data: dict[str, Any], source: Path) -> TransformerConfig:
    """Our config for the GPT-2 config.json `data` (read from `source`), weights unread."""
    dims, act_fn, tied, eps, scale = _read_config(data, source)
    return gpt2_config(dims, act_fn=act_fn, tied=tied, eps=eps, attn_scale=scale)


def _read_config(data: dict[str, Any], source: Path) -> tuple[GPT2Dims, str, bool, float, str]:
    """(dims, our act_fn, tied, LayerNorm eps, attention scale) from a GPT-2 config.json."""
    kind = data.get("model_type")
    if kind != "gpt2":
        raise CheckpointError(f"{source}: model_type {kind!r} is not a GPT-2 model; load it through "
                              "TransformerLens and pass the model to the probes")
    for flag in ("add_cross_attention", "scale_attn_by_inverse_layer_idx"):
        if data.get(flag):
            raise CheckpointError(f"{source}: {flag}=true is a GPT-2 variant this loader does not "
                                  "build; load it through TransformerLens and pass the model to the probes")
    ints = {}
    for name in ("n_layer", "n_head", "n_embd", "n_positions", "vocab_size"):
        value = data.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(f"{source}: {name!r} must be a positive integer, got {value!r}")
        ints[name] = value
    if ints["n_embd"] % ints["n_head"]:
        raise CheckpointError(f"{source}: n_embd={ints['n_embd']} is not divisible by n_head={ints['n_head']}")
    n_inner = data.get("n_inner") or 4 * ints["n_embd"]
    act = data.get("activation_function", "gelu_new")
    if act not in ACTIVATIONS:
        raise CheckpointError(f"{source}: activation_function {act!r} is not one of {sorted(ACTIVATIONS)}")
    eps = data.get("layer_norm_epsilon", 1e-5)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise CheckpointError(f"{source}: layer_norm_epsilon must be a number > 0, got {eps!r}")
    dims = GPT2Dims(n_layer=ints["n_layer"], n_head=ints["n_head"], n_embd=ints["n_embd"],
                    n_ctx=ints["n_positions"], vocab_size=ints["vocab_size"], d_mlp=n_inner, bias=True)
    scale = "sqrt_d_head" if data.get("scale_attn_weights", True) else "none"
    return dims, ACTIVATIONS[act], bool(data.get("tie_word_embeddings", True)), float(eps), scale


def _read_weights(directory: Path) -> tuple[Path, dict[str, Any]]:
    for name in HF_WEIGHTS:
        path = directory / name
        if path.is_file():
            state = read_safetensors(path) if name.endswith(".safetensors") else torch_load(path)
            if not isinstance(state, dict):
                raise CheckpointError(f"{path}: expected a state dict, got {type(state).__name__}")
            return path, state
    if (directory / "model.safetensors.index.json").is_file():
        raise CheckpointError(f"{directory}: sharded weights (model.safetensors.index.json) are not "
                              "read here; save the model unsharded (save_pretrained(max_shard_size='10GB'))")
    raise CheckpointError(f"{directory}: a Hugging Face directory needs {' or '.join(HF_WEIGHTS)}")


def _prefixed(state: dict[str, Any]) -> dict[str, Any]:
    """GPT2LMHeadModel's names (``transformer.h.0...``, ``lm_head.weight``) from either class's
    file: a bare GPT2Model saves ``h.0...``."""
    return {k if k.startswith(("transformer.", "lm_head.")) else f"transformer.{k}": v
            for k, v in state.items()}


def _tokenizer(directory: Path, d_vocab: int) -> tuple[Any, str | None]:
    files = find_gpt2_files(directory)
    if files is None:
        hint = ("the directory has no GPT-2 tokenizer files: save the model's tokenizer there "
                "(tokenizer.save_pretrained(DIR) writes tokenizer.json, or vocab.json and merges.txt)")
        logger.warning("%s: loaded with token ids only; %s", directory, hint)
        return None, hint
    try:
        tokenizer = GPT2BPETokenizer.from_files(files)
    except TokenizerError as exc:
        raise CheckpointError(str(exc)) from None
    check_vocab_fits(tokenizer, d_vocab, files[0])
    return tokenizer, None
