"""Hugging Face Llama / Qwen2, tiny and in memory (nothing downloaded): `hf_pair("llama" | "qwen2")`
gives the same random weights as an SDPA model and an eager one; the eager one's
`output_attentions=True` gives the reference patterns (`hf_patterns`).
"""

from __future__ import annotations

import torch

from .tutorial import D, VOCAB


def hf_config(kind: str, attn_implementation: str):
    common = dict(vocab_size=VOCAB, hidden_size=D, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  attn_implementation=attn_implementation)
    if kind == "llama":
        from transformers import LlamaConfig
        return LlamaConfig(**common)
    if kind == "qwen2":
        from transformers import Qwen2Config
        return Qwen2Config(**common)
    raise ValueError(f"unknown kind {kind!r}: llama or qwen2")


def hf_model(kind: str, attn_implementation: str = "sdpa", seed: int = 0):
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM
    torch.manual_seed(seed)
    cls = LlamaForCausalLM if kind == "llama" else Qwen2ForCausalLM
    model = cls(hf_config(kind, attn_implementation)).eval()
    with torch.no_grad():  # random norm gains, so a reading that skips them differs
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
    return model


def hf_pair(kind: str, seed: int = 0):
    """(SDPA model, eager model) with the same weights."""
    sdpa = hf_model(kind, "sdpa", seed)
    eager = hf_model(kind, "eager", seed)
    eager.load_state_dict(sdpa.state_dict())
    return sdpa, eager


def hf_patterns(eager, ids: torch.Tensor) -> list[torch.Tensor]:
    """Hugging Face's own eager patterns: [batch head q k] per layer."""
    with torch.no_grad():
        return [a.detach() for a in eager(ids, output_attentions=True).attentions]
