"""GPT-2's tensor layout, shared by nanoGPT and Hugging Face: names, shapes, and the map to ours.

Both name a block's tensors ``transformer.h.{i}.ln_1 / attn.c_attn / attn.c_proj / ln_2 /
mlp.c_fc / mlp.c_proj`` around ``transformer.wte / wpe / ln_f`` and ``lm_head``. nanoGPT's
projections are ``nn.Linear`` (weight [out in]); Hugging Face's are ``Conv1D`` (weight [in out],
the transpose). ``c_attn`` holds q|k|v, each head after head: exactly the column order of our
packed ``W_QKV`` [d_model (3 head d_head)] (:mod:`models.packed_heads`), which it becomes
as it is. Names and shapes are checked here, in the source's own names, before anything
is built, so a file whose config disagrees with its weights fails in one line naming the tensor.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from models.config import TransformerConfig
from models.store.files import CheckpointError

__all__ = ["GPT2Dims", "check_layout", "check_vocab_fits", "gpt2_config", "our_state", "without_buffers"]

logger = logging.getLogger(__name__)

BLOCK = "transformer.h.{i}."
PAD_MULTIPLES = (64, 128)  # nanoGPT pads GPT-2's 50257 ids to 50304; others pad to a multiple of 128
MASK_BUFFERS = (".attn.bias", ".attn.masked_bias")  # the causal mask some versions save: not weights


@dataclass(frozen=True)
class GPT2Dims:
    """What a GPT-2-shaped model's config says (nanoGPT's model_args or Hugging Face's config.json)."""

    n_layer: int
    n_head: int
    n_embd: int
    n_ctx: int
    vocab_size: int
    d_mlp: int
    bias: bool  # biases on every Linear and LayerNorm (nanoGPT's switch; Hugging Face: always)

    def names(self) -> str:  # for messages: what the config said
        return (f"n_layer={self.n_layer}, n_head={self.n_head}, n_embd={self.n_embd}, "
                f"block_size={self.n_ctx}, vocab_size={self.vocab_size}, bias={self.bias}")


def gpt2_config(dims: GPT2Dims, *, act_fn: str, tied: bool, eps: float = 1e-5,
                attn_scale: str = "sqrt_d_head", dropout: float = 0.0) -> TransformerConfig:
    """Our config for a GPT-2-shaped model: pre-LayerNorm, learned positions, final norm."""
    return TransformerConfig(
        d_vocab=dims.vocab_size, n_ctx=dims.n_ctx, d_model=dims.n_embd, n_layers=dims.n_layer,
        n_heads=dims.n_head, d_head=dims.n_embd // dims.n_head, d_mlp=dims.d_mlp, act_fn=act_fn,
        attn_scale=attn_scale, norm="layer", norm_eps=eps, norm_bias=dims.bias, final_norm=True,
        attn_bias=dims.bias, mlp_bias=dims.bias, unembed="tied" if tied else "separate",
        dropout=dropout, init="gpt2")


def expected_shapes(dims: GPT2Dims, *, conv1d: bool, lm_head: bool) -> dict[str, list[int]]:
    """Source name -> shape, in the source's layout."""
    C, F = dims.n_embd, dims.d_mlp

    def proj(d_in: int, d_out: int) -> list[int]:
        return [d_in, d_out] if conv1d else [d_out, d_in]

    shapes = {"transformer.wte.weight": [dims.vocab_size, C], "transformer.wpe.weight": [dims.n_ctx, C]}
    for i in range(dims.n_layer):
        block = BLOCK.format(i=i)
        for name, (d_in, d_out) in (("attn.c_attn", (C, 3 * C)), ("attn.c_proj", (C, C)),
                                    ("mlp.c_fc", (C, F)), ("mlp.c_proj", (F, C))):
            shapes[f"{block}{name}.weight"] = proj(d_in, d_out)
            if dims.bias:
                shapes[f"{block}{name}.bias"] = [d_out]
        for ln in ("ln_1", "ln_2"):
            shapes[f"{block}{ln}.weight"] = [C]
            if dims.bias:
                shapes[f"{block}{ln}.bias"] = [C]
    shapes["transformer.ln_f.weight"] = [C]
    if dims.bias:
        shapes["transformer.ln_f.bias"] = [C]
    if lm_head:
        shapes["lm_head.weight"] = [dims.vocab_size, C]
    return shapes


def without_buffers(state: dict[str, object]) -> dict[str, object]:
    """The state dict without the attention-mask buffers (`.attn.bias`, `.attn.masked_bias`)."""
    return {k: v for k, v in state.items() if not (isinstance(k, str) and k.endswith(MASK_BUFFERS))}


def check_layout(state: dict[str, object], dims: GPT2Dims, *, conv1d: bool, lm_head: bool,
                 source: Path, said_by: str) -> None:
    """Every tensor the config implies is there with its shape, and nothing else is: the first
    disagreement is one CheckpointError naming the tensor and what `said_by` (model_args,
    config.json) said."""
    want = expected_shapes(dims, conv1d=conv1d, lm_head=lm_head)
    for name, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise CheckpointError(f"{source}: entry {name!r} is a {type(value).__name__}, not a tensor")
        if name not in want:
            raise CheckpointError(f"{source}: unexpected tensor {name!r} (shape {list(value.shape)}): "
                                  f"{said_by} ({dims.names()}) disagree with the weights")
        if list(value.shape) != want[name]:
            raise CheckpointError(f"{source}: tensor {name!r} has shape {list(value.shape)} but "
                                  f"{said_by} ({dims.names()}) imply {want[name]}")
        if not value.is_floating_point():
            raise CheckpointError(f"{source}: tensor {name!r} is stored as {value.dtype}, not floating point")
    missing = [name for name in want if name not in state]
    if missing:
        raise CheckpointError(f"{source}: tensor {missing[0]!r} is missing ({len(missing)} of {len(want)} "
                              f"missing): {said_by} ({dims.names()}) disagree with the weights")


def _linear(weight: torch.Tensor, conv1d: bool) -> torch.Tensor:
    """An nn.Linear weight [out in] from either layout (a view, no copy)."""
    return weight.T if conv1d else weight


def our_state(state: dict[str, torch.Tensor], cfg: TransformerConfig, *, conv1d: bool) -> dict[str, torch.Tensor]:
    """The source's tensors under our in-memory names (the packed ``W_QKV``, not the per-head
    names of our files), as views where a transpose is needed: the model takes them as they are."""
    out = {"embedding.weight": state["transformer.wte.weight"], "W_pos": state["transformer.wpe.weight"]}
    for i in range(cfg.n_layers):
        src, dst = BLOCK.format(i=i), f"blocks.{i}."
        for ln, ours in (("ln_1", "ln1"), ("ln_2", "ln2")):
            out[f"{dst}{ours}.gamma"] = state[f"{src}{ln}.weight"]
            if cfg.norm_bias:
                out[f"{dst}{ours}.beta"] = state[f"{src}{ln}.bias"]
        # c_attn is our packed q|k|v as it stands: no per-head split, no copy
        out[f"{dst}attention.W_QKV"] = _linear(state[f"{src}attn.c_attn.weight"], conv1d).T  # [d_model (3 head d_head)]
        if cfg.attn_bias:
            out[f"{dst}attention.b_QKV"] = state[f"{src}attn.c_attn.bias"]  # [(3 head d_head)]
        out[f"{dst}attention.W_O"] = _linear(state[f"{src}attn.c_proj.weight"], conv1d).T  # [d_attn d_model]
        if cfg.attn_bias:
            out[f"{dst}attention.b_O"] = state[f"{src}attn.c_proj.bias"]
        for name, index in (("c_fc", 0), ("c_proj", 2)):
            out[f"{dst}mlp.net.{index}.weight"] = _linear(state[f"{src}mlp.{name}.weight"], conv1d)
            if cfg.mlp_bias:
                out[f"{dst}mlp.net.{index}.bias"] = state[f"{src}mlp.{name}.bias"]
    out["ln_final.gamma"] = state["transformer.ln_f.weight"]
    if cfg.norm_bias:
        out["ln_final.beta"] = state["transformer.ln_f.bias"]
    if cfg.unembed == "separate":
        out["W_out"] = state["lm_head.weight"].T  # [d_model d_vocab]
    return out


def is_tied(state: dict[str, torch.Tensor]) -> bool:
    """No lm_head, or one equal to the token embedding (nanoGPT ties them; torch.save keeps one
    storage for both, so the common case is a pointer comparison)."""
    head, wte = state.get("lm_head.weight"), state.get("transformer.wte.weight")
    if head is None or wte is None:
        return True
    if head.shape != wte.shape:
        return False
    return head.data_ptr() == wte.data_ptr() or bool(torch.equal(head, wte))


def check_vocab_fits(tokenizer: Any, d_vocab: int, source: Path) -> None:
    """Refuse a tokenizer that is not the model's: more tokens than the model's vocabulary, or
    fewer by more than its special tokens; a model that pads its vocabulary to a multiple of 64
    or 128 (nanoGPT's 50304 for GPT-2's 50257) loads with one warning naming the padding ids."""
    n, special = tokenizer.vocab_size, getattr(tokenizer, "special_count", 0)
    gap = d_vocab - n
    if 0 <= gap <= special:
        return
    if gap > 0 and any(d_vocab % m == 0 and gap < m for m in PAD_MULTIPLES):
        logger.warning("%s: the tokenizer has %d tokens and the model's vocabulary %d: the model pads it, "
                       "ids %d..%d are padding that no text encodes to", source, n, d_vocab, n, d_vocab - 1)
        return
    raise CheckpointError(f"{source}: the tokenizer has {n:,} tokens ({special} special) but the model's "
                          f"vocabulary has {d_vocab:,}: it is not this model's tokenizer; put the model's "
                          "own tokenizer files beside it")
