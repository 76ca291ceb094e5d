"""Hook points of our transformers: every hook that fires by default, with its shape; hook_result
off by default and summing to attn_out; interventions with run_with_hooks (a zero-ablated head, a
uniform pattern, identity hooks) on the `_small` presets.
"""

from __future__ import annotations

import pytest
import torch
from close import assert_close_to_scale
from models_kit import SMALL_TF, build, expected_hooks, rand_tokens

from models import get_preset


@pytest.mark.parametrize("name", SMALL_TF)
def test_hook_walk(name):
    cfg = get_preset(name)
    model = build(name)
    toks = rand_tokens(cfg)
    logits, cache = model.run_with_cache(toks)
    want = expected_hooks(cfg)
    got = {k: tuple(v.shape) for k, v in cache.items()}
    assert got == want  # exactly these names (TransformerLens spelling), exactly these shapes
    assert set(model.hook_dict) == set(want) | {f"blocks.{l}.attn.hook_result"
                                                for l in range(cfg.n_layers)}
    assert_close_to_scale(logits, model(toks))

    causal = torch.ones(cfg.n_ctx, cfg.n_ctx, dtype=torch.bool).triu(1)
    for l in range(cfg.n_layers):
        pattern = cache[f"blocks.{l}.attn.hook_pattern"]
        scores = cache[f"blocks.{l}.attn.hook_attn_scores"]
        assert (pattern[..., causal] == 0).all()  # exactly zero above the diagonal
        torch.testing.assert_close(pattern.sum(-1), torch.ones(pattern.shape[:-1]), atol=1e-6, rtol=0)
        assert torch.isneginf(scores[..., causal]).all() and torch.isfinite(scores[..., ~causal]).all()
        torch.testing.assert_close(scores.softmax(-1), pattern)
        # z is the pattern-weighted sum of v, head by head
        z = torch.einsum("bhqk,bkhe->bqhe", pattern, cache[f"blocks.{l}.attn.hook_v"])
        torch.testing.assert_close(cache[f"blocks.{l}.attn.hook_z"], z, atol=1e-5, rtol=1e-5)
        if cfg.residual:
            torch.testing.assert_close(
                cache[f"blocks.{l}.hook_resid_mid"],
                cache[f"blocks.{l}.hook_resid_pre"] + cache[f"blocks.{l}.hook_attn_out"])
        if l + 1 < cfg.n_layers:
            assert torch.equal(cache[f"blocks.{l}.hook_resid_post"],
                               cache[f"blocks.{l + 1}.hook_resid_pre"])
    expected_resid0 = cache["hook_embed"] + (cache["hook_pos_embed"] if "hook_pos_embed" in cache else 0)
    torch.testing.assert_close(cache["blocks.0.hook_resid_pre"], expected_resid0)


@pytest.mark.parametrize("name", SMALL_TF)
def test_hook_result_off_by_default(name):
    model = build(name)
    _, cache = model.run_with_cache(rand_tokens(get_preset(name)))
    assert not any(k.endswith("hook_result") for k in cache.keys())


@pytest.mark.parametrize("name", SMALL_TF)
def test_hook_result_sums_to_attn_out(name):
    cfg = get_preset(name)
    model = build(name)
    model.set_use_attn_result(True)
    toks = rand_tokens(cfg)
    logits, cache = model.run_with_cache(toks)
    for l in range(cfg.n_layers):
        result = cache[f"blocks.{l}.attn.hook_result"]
        assert result.shape == (2, cfg.n_ctx, cfg.n_heads, cfg.d_model)
        attn = model.blocks[l].attention
        b_O = attn.b_O if cfg.attn_bias and cfg.attn_out_proj else 0
        torch.testing.assert_close(result.sum(2) + b_O, cache[f"blocks.{l}.hook_attn_out"],
                                   atol=1e-5, rtol=1e-5)
        z = cache[f"blocks.{l}.attn.hook_z"]
        h = cfg.n_heads - 1
        if cfg.attn_out_proj:  # per head: z_h @ (rows of W_O that read head h)
            W_O = attn.W_O.view(cfg.n_heads, cfg.d_head, cfg.d_model)
            torch.testing.assert_close(result[:, :, h], z[:, :, h] @ W_O[h], atol=1e-5, rtol=1e-5)
        else:  # no W_O (the series' single-head nets): head h writes z_h into its own slice
            own = slice(h * cfg.d_head, (h + 1) * cfg.d_head)
            torch.testing.assert_close(result[:, :, h, own], z[:, :, h])
            assert (result[:, :, h, :own.start] == 0).all() and (result[:, :, h, own.stop:] == 0).all()
    model.set_use_attn_result(False)
    assert_close_to_scale(model(toks), logits)


# --------------------------------------------------------------------------------------------
# interventions with run_with_hooks
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", SMALL_TF)
def test_zero_ablating_a_head_changes_logits(name):
    cfg = get_preset(name)
    model = build(name)
    toks = rand_tokens(cfg)
    clean = model(toks)
    seen = []

    def ablate_head0(z, hook):
        seen.append(hook.name)
        z = z.clone()
        z[:, :, 0] = 0.0
        return z

    ablated = model.run_with_hooks(toks, fwd_hooks=[("blocks.0.attn.hook_z", ablate_head0)])
    assert seen == ["blocks.0.attn.hook_z"]
    assert (ablated - clean).abs().max() > 1e-3
    # only positions change, never shapes; and the hook is gone afterwards
    assert ablated.shape == clean.shape
    torch.testing.assert_close(model(toks), clean)


@pytest.mark.parametrize("name", SMALL_TF)
def test_uniform_pattern_equals_zero_query_key_weights(name):
    """softmax of constant (zero) scores over the causal prefix is 1/(q+1) on keys 0..q."""
    cfg = get_preset(name)
    model = build(name)
    toks = rand_tokens(cfg)
    n = cfg.n_ctx
    uniform = torch.ones(n, n).tril() / torch.arange(1, n + 1).unsqueeze(1)  # [q k]

    def set_uniform(pattern, hook):
        return uniform.expand_as(pattern).clone()

    hooked = model.run_with_hooks(toks, fwd_hooks=[(lambda nm: nm.endswith("hook_pattern"), set_uniform)])

    zeroed = build(name)
    with torch.no_grad():
        for block in zeroed.blocks:
            for head in block.attention.heads:
                head.W_Q.zero_()
                head.W_K.zero_()
    _, cache = zeroed.run_with_cache(toks, names_filter=lambda nm: nm.endswith("hook_pattern"))
    torch.testing.assert_close(cache["blocks.0.attn.hook_pattern"][0, 0], uniform)
    assert_close_to_scale(hooked, zeroed(toks))
    assert (hooked - model(toks)).abs().max() > 1e-4


@pytest.mark.parametrize("name", SMALL_TF)
def test_identity_hooks_change_nothing(name):
    cfg = get_preset(name)
    model = build(name)
    toks = rand_tokens(cfg)
    model.set_attn_impl("explicit")  # identity hooks on the pattern force explicit anyway
    clean = model(toks)
    calls = []

    def identity(x, hook):
        calls.append(hook.name)
        return x

    hooked = model.run_with_hooks(toks, fwd_hooks=[(lambda nm: True, identity)])
    assert set(calls) == set(expected_hooks(cfg))
    torch.testing.assert_close(hooked, clean, atol=1e-6, rtol=0)
