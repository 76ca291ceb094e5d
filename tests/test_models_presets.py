"""Presets: every full preset has a `_small` twin that keeps its switches, the small ones build
and run, and parameter counts agree with hand-derived formulas (the FULL presets built on the
meta device: no memory, no init cost) and with the numbers the series and the blog feed print.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from close import assert_close_to_scale
from models_kit import ALL, FULL, SMALL, build, expected_params, n_params, rand_tokens

from models import PRESETS, MLPConfig, TransformerConfig, build_model, get_preset


def test_preset_catalogue():
    assert list(PRESETS) == ALL
    assert set(FULL) == {"char_mlp", "token_mlp", "attn1_noscale", "attn1_sqrtd", "attn1_residual",
                         "mha4_fullrank", "mha4", "transformer2", "transformer4",
                         "transformer4_rms", "tiny_shakespeare_gpt", "gpt2_124m"}
    assert set(SMALL) == {f"{n}_small" for n in FULL}
    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        get_preset("nope")


@pytest.mark.parametrize("name", FULL)
def test_small_twin_keeps_every_switch(name):
    """A `_small` twin changes only sizes, never an architectural switch."""
    full, small = get_preset(name), get_preset(name + "_small")
    sizes = {"d_vocab", "n_ctx", "d_model", "n_heads", "d_head", "d_mlp", "n_layers", "d_embed",
             "d_hidden"}
    for f in dataclasses.fields(full):
        if f.name not in sizes:
            assert getattr(full, f.name) == getattr(small, f.name), f.name
    if isinstance(full, TransformerConfig):
        assert (full.d_head == full.d_model) == (small.d_head == small.d_model)  # full-rank kept


@pytest.mark.parametrize("name", SMALL)
def test_small_preset_builds_and_runs(name):
    cfg = get_preset(name)
    model = build(name)
    toks = rand_tokens(cfg, batch=3)
    logits = model(toks)
    n_out = 1 if isinstance(cfg, MLPConfig) else cfg.n_ctx
    assert logits.shape == (3, n_out, cfg.d_vocab)
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
    # a short prefix works for transformers (probes feed the last, shorter window)
    if isinstance(cfg, TransformerConfig):
        assert model(toks[:, :5]).shape == (3, 5, cfg.d_vocab)
        assert_close_to_scale(model(toks[:, :5]), logits[:, :5])


@pytest.mark.parametrize("name", FULL)
def test_full_preset_param_count_on_meta(name):
    cfg = get_preset(name)
    with torch.device("meta"):
        model = build_model(cfg)
    assert all(p.device.type == "meta" for p in model.parameters())
    assert n_params(model) == expected_params(cfg)


@pytest.mark.parametrize("name", SMALL)
def test_small_preset_param_count(name):
    assert n_params(build(name)) == expected_params(get_preset(name))


@pytest.mark.parametrize("name, exact, printed", [
    # series log (transformer4_rms run): "n_params=23.1M"
    ("transformer4_rms", 23_096_320, "23.1M"),
    # series attention post: "Our model has 6.5M params"
    ("attn1_residual", 6_500_608, "6.5M"),
    # blog feed: "A 1.83M-parameter decoder-only transformer", with biases on the attention
    # out-projection (4 * 192) and on lm_head (65) as in nanoGPT's Tiny Shakespeare model
    ("tiny_shakespeare_gpt", 1_827_137, "1.83M"),
    # GPT-2 124M with the vocabulary padded to 50304: 124,439,808 (vocab 50257) + 47 * 768
    ("gpt2_124m", 124_439_808 + 47 * 768, "124M"),
])
def test_param_counts_match_the_sources(name, exact, printed):
    with torch.device("meta"):
        model = build_model(get_preset(name))
    count = n_params(model)
    assert count == exact == expected_params(get_preset(name))
    digits = printed[:-1].split(".")[1] if "." in printed else ""
    assert f"{count / 1e6:.{len(digits)}f}M" == printed


def test_gpt2_parameter_layout_on_meta():
    """Tied (no W_out), biases on Q/K/V/O, LayerNorm gamma/beta, final norm."""
    with torch.device("meta"):
        model = build_model(get_preset("gpt2_124m"))
    names = model.series_parameters()
    assert "W_out" not in names
    assert names["blocks.11.attention.heads.11.b_Q"].shape == (64,)
    packed = dict(model.named_parameters())  # in memory: one q/k/v parameter per layer
    assert packed["blocks.0.attention.W_QKV"].shape == (768, 3 * 768)
    assert packed["blocks.0.attention.b_QKV"].shape == (3 * 768,)
    assert names["embedding.weight"].shape == (50304, 768)
    assert names["W_pos"].shape == (1024, 768)
    for key in ("attention.heads.11.b_Q", "attention.b_O", "ln1.gamma", "ln1.beta", "ln2.beta"):
        assert f"blocks.11.{key}" in names
    assert {"ln_final.gamma", "ln_final.beta"} <= set(names)
    assert names["blocks.0.attention.W_O"].shape == (768, 768)
    assert names["blocks.0.mlp.net.0.weight"].shape == (3072, 768)
