"""A tiny Llama-family model, built offline: a TransformerLens native bridge with RMSNorm, a gated
(SwiGLU) MLP, rotary positions, grouped-query attention (4 query heads over 2 kv heads), and no
biases anywhere (the native model's attention biases are removed, as Llama has none).

Its norm gains are random (not 1), so a probe that ignores them gives a different answer.
`tl_folded_twin()` is the same model with the norms folded in by TransformerLens itself
(`enable_compatibility_mode(fold_ln=True)`): the reference for its ActivationCache helpers.
"""

from __future__ import annotations

import pytest
import torch

LLAMA_CFG = {"n_layers": 2, "d_model": 32, "n_heads": 4, "d_head": 8, "d_mlp": 64, "d_vocab": 50,
             "n_ctx": 16, "act_fn": "silu", "normalization_type": "RMS", "final_rms": True,
             "gated_mlp": True, "positional_embedding_type": "rotary", "n_key_value_heads": 2,
             "seed": 0}


def bias_free_bridge():
    from transformer_lens import TransformerBridge

    bridge = TransformerBridge.boot_native(dict(LLAMA_CFG)).eval()
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for layer in bridge.original_model.layers:
            attn = layer._original_component.attn._original_component
            for name in "qkvo":
                getattr(attn, name)._original_component.bias = None  # Llama: no attention biases
        for p in bridge.parameters():
            if p.dim() == 1:  # the norms' gains: the only vectors left
                p.copy_(1.0 + 0.5 * torch.randn(p.shape, generator=gen))
    assert not any(n.endswith("bias") for n, _ in bridge.named_parameters())
    return bridge


def tl_folded_twin():
    """The same weights with every norm's gain folded into the next matrix, by TransformerLens."""
    twin = bias_free_bridge()
    twin.enable_compatibility_mode(disable_warnings=True, fold_ln=True, center_writing_weights=False,
                                   center_unembed=False, fold_value_biases=False)
    return twin


@pytest.fixture(scope="module")
def llama():
    return bias_free_bridge()


def llama_tokens(batch: int = 1, pos: int = 12, seed: int = 7) -> torch.Tensor:
    return torch.randint(0, LLAMA_CFG["d_vocab"], (batch, pos), generator=torch.Generator().manual_seed(seed))
