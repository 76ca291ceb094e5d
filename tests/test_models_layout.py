"""Norm placement (pre-norm feeds normalised input to attention and MLP, post-norm normalises the
residual stream), tied, separate and MLP unembeddings, the unembed and out biases, dropout only
in training.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from models_kit import build, rand_tokens

from models import get_preset


# --------------------------------------------------------------------------------------------
# norm placement and unembedding
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_pre_norm_feeds_normalised_input_to_attention_and_mlp(norm):
    cfg = get_preset("transformer4_rms_small", norm=norm, attn_bias=False)
    model = build(cfg)
    with torch.no_grad():  # non-trivial gains so that gamma/beta are exercised
        for p in model.parameters():
            if p.dim() == 1 and p.shape[0] == cfg.d_model:
                p.add_(torch.randn_like(p) * 0.3)
    _, cache = model.run_with_cache(rand_tokens(cfg))
    block = model.blocks[0]
    ln1, ln2 = (getattr(block, f"{'rms' if norm == 'rms' else 'ln'}{i}") for i in (1, 2))
    resid_pre, resid_mid = cache["blocks.0.hook_resid_pre"], cache["blocks.0.hook_resid_mid"]
    q = torch.einsum("bpd,de->bpe", ln1(resid_pre), block.attention.heads[2].W_Q)
    torch.testing.assert_close(cache["blocks.0.attn.hook_q"][:, :, 2], q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache["blocks.0.mlp.hook_pre"], block.mlp.net[0](ln2(resid_mid)),
                               atol=1e-5, rtol=1e-5)
    # the residual stream itself is not normalised in pre-norm
    torch.testing.assert_close(resid_mid, resid_pre + cache["blocks.0.hook_attn_out"])
    normalized = cache["blocks.0.ln1.hook_normalized"]
    if norm == "rms":
        torch.testing.assert_close(normalized.pow(2).mean(-1), torch.ones(normalized.shape[:2]),
                                   atol=1e-4, rtol=0)
    else:
        torch.testing.assert_close(normalized.mean(-1), torch.zeros(normalized.shape[:2]),
                                   atol=1e-5, rtol=0)
    torch.testing.assert_close(cache["blocks.0.ln1.hook_scale"],
                               (resid_pre.pow(2) if norm == "rms" else
                                (resid_pre - resid_pre.mean(-1, keepdim=True)).pow(2))
                               .mean(-1, keepdim=True).add(cfg.norm_eps).sqrt())


@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_post_norm_normalises_the_residual_stream(norm):
    cfg = get_preset("transformer4_rms_small", norm=norm, norm_placement="post")
    model = build(cfg)
    toks = rand_tokens(cfg)
    logits, cache = model.run_with_cache(toks)
    for l, block in enumerate(model.blocks):
        ln1, ln2 = (getattr(block, f"{'rms' if norm == 'rms' else 'ln'}{i}") for i in (1, 2))
        pre = f"blocks.{l}."
        resid_pre = cache[pre + "hook_resid_pre"]
        # attention reads the raw stream
        q = torch.einsum("bpd,de->bpe", resid_pre, block.attention.heads[0].W_Q)
        torch.testing.assert_close(cache[pre + "attn.hook_q"][:, :, 0], q, atol=1e-5, rtol=1e-5)
        resid_mid = ln1(resid_pre + cache[pre + "hook_attn_out"])
        torch.testing.assert_close(cache[pre + "hook_resid_mid"], resid_mid, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(cache[pre + "hook_resid_post"],
                                   ln2(resid_mid + cache[pre + "hook_mlp_out"]), atol=1e-5, rtol=1e-5)
        # with gamma = 1 the stream leaves each sub-block at unit RMS
        rms = cache[pre + "hook_resid_post"].pow(2).mean(-1).sqrt()
        torch.testing.assert_close(rms, torch.ones_like(rms), atol=1e-4, rtol=0)
    torch.testing.assert_close(logits, cache[f"blocks.{cfg.n_layers - 1}.hook_resid_post"] @ model.W_out)
    # pre and post placement differ on the same weights
    pre_model = build(cfg.replace(norm_placement="pre"))
    pre_model.load_state_dict(model.state_dict())
    assert (pre_model(toks) - logits).abs().max() > 1e-3


def test_tied_unembedding():
    cfg = get_preset("gpt2_124m_small")
    assert cfg.unembed == "tied"
    model = build(cfg)
    assert "W_out" not in dict(model.named_parameters())
    assert model.W_U.shape == (cfg.d_model, cfg.d_vocab)
    assert torch.equal(model.W_U, model.embedding.weight.T)
    assert model.W_U.data_ptr() == model.embedding.weight.data_ptr()  # a view, not a copy
    toks = rand_tokens(cfg)
    logits, cache = model.run_with_cache(toks)
    final = model.ln_final(cache[f"blocks.{cfg.n_layers - 1}.hook_resid_post"])
    torch.testing.assert_close(logits, final @ model.embedding.weight.T, atol=1e-5, rtol=1e-5)
    # the unembedding trains the embedding: rows of unseen tokens still get gradient
    F.cross_entropy(logits.flatten(0, 1), toks.roll(-1, 1).flatten()).backward()
    unseen = sorted(set(range(cfg.d_vocab)) - set(toks.flatten().tolist()))
    assert unseen and model.embedding.weight.grad[unseen].abs().sum() > 0
    # editing the embedding edits the unembedding
    with torch.no_grad():
        model.embedding.weight[5].zero_()
    assert (model(toks)[..., 5] == 0).all()
    assert (model.W_U[:, 5] == 0).all()


def test_separate_and_mlp_unembedding():
    model = build("transformer2_small")
    assert model.W_U is model.W_out
    cfg = get_preset("attn1_sqrtd_small")
    mlp_unembed = build(cfg)
    assert not hasattr(mlp_unembed, "W_out")
    with pytest.raises(ValueError, match="no unembedding matrix"):
        _ = mlp_unembed.W_U
    logits, cache = mlp_unembed.run_with_cache(rand_tokens(cfg))
    assert torch.equal(logits, cache["blocks.0.hook_resid_post"])


def test_dropout_only_in_training_mode():
    cfg = get_preset("tiny_shakespeare_gpt_small")
    assert cfg.dropout > 0
    model = build(cfg)
    toks = rand_tokens(cfg)
    torch.testing.assert_close(model(toks), model(toks))
    model.train()
    torch.manual_seed(0)
    a = model(toks)
    b = model(toks)
    assert (a - b).abs().max() > 1e-4


def test_unembed_and_out_biases_are_added_where_configured():
    """tiny_shakespeare_gpt carries nanoGPT's lm_head bias and attention-projection bias."""
    cfg = get_preset("tiny_shakespeare_gpt_small")
    assert cfg.unembed_bias and cfg.attn_out_bias and not cfg.attn_bias
    model = build(cfg).eval()
    with torch.no_grad():
        model.b_out.copy_(torch.arange(cfg.d_vocab, dtype=torch.float32))
        model.blocks[0].attention.b_O.fill_(0.5)
    tokens = torch.randint(0, cfg.d_vocab, (2, 8))
    logits, cache = model.run_with_cache(tokens)
    resid = cache["ln_final.hook_normalized"] * model.ln_final.gamma + model.ln_final.beta
    assert torch.allclose(logits, resid @ model.W_U + model.b_out, atol=1e-5)
    assert model.b_U is model.b_out
    assert build(get_preset("gpt2_124m_small")).b_U is None
    for bad in ({"unembed": "mlp", "residual": False, "n_layers": 1, "final_norm": False,
                 "unembed_bias": True, "attn_out_bias": False},
                {"attn_out_proj": False, "n_heads": 1, "d_head": 32}):
        with pytest.raises(ValueError, match="unembed_bias|attn_out_bias"):
            cfg.replace(**bad)
