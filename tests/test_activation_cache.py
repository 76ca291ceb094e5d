"""`run_with_cache` on our models returns a TransformerLens `ActivationCache`.

Checked by hand-computed identities (the residual decompositions sum to the residual, head
results plus b_O are the attention output, the lens at the last layer reads out the logits) and
against a `TransformerBridge.boot_native` twin holding our weights: the same calls on both give
the same numbers.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_interop import BRIDGE_CFG, bridge, ours  # noqa: F401  (fixtures: the interop twins)
from transformer_lens import ActivationCache

from models import build_model, get_preset
from models.checkpoint import load_checkpoint

SHIPPED = Path(__file__).resolve().parents[1] / "checkpoints" / "shakespeare_rms4"
TOL = dict(atol=1e-5, rtol=1e-5)


def randomise_norms_and_biases(model: torch.nn.Module) -> None:
    """Norm gains/shifts and biases start at 1/0; random values make every term count."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("gamma", "beta", "bias", "b_O", "b_out")):
                base = 1.0 if name.endswith("gamma") else 0.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=gen))


def bridge_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Our twin's weights under the native bridge's names (nn.Linear layout [out in])."""
    cfg = model.cfg
    sd = {"embed.weight": model.embedding.weight, "pos_embed.weight": model.W_pos,
          "ln_final.weight": model.ln_final.gamma, "ln_final.bias": model.ln_final.beta,
          "unembed.weight": model.W_out.T, "unembed.bias": model.b_out}
    for l, block in enumerate(model.blocks):
        pre, attn, mlp = f"blocks.{l}.", block.attention, block.mlp.net
        for i in (1, 2):
            norm = getattr(block, f"ln{i}")
            sd[f"{pre}ln{i}.weight"], sd[f"{pre}ln{i}.bias"] = norm.gamma, norm.beta
        for x in "qkv":  # heads side by side: [head*d_head d_model]
            sd[f"{pre}attn.{x}.weight"] = attn.stacked(f"W_{x.upper()}").transpose(1, 2).flatten(0, 1)
            sd[f"{pre}attn.{x}.bias"] = torch.zeros(cfg.d_attn)
        sd[f"{pre}attn.o.weight"], sd[f"{pre}attn.o.bias"] = attn.W_O.T, attn.b_O
        sd[f"{pre}mlp.in.weight"], sd[f"{pre}mlp.in.bias"] = mlp[0].weight, mlp[0].bias
        sd[f"{pre}mlp.out.weight"], sd[f"{pre}mlp.out.bias"] = mlp[2].weight, mlp[2].bias
    return {k: v.detach().clone() for k, v in sd.items()}


@pytest.fixture(scope="module")
def twins(bridge, ours):  # noqa: F811
    randomise_norms_and_biases(ours)
    bridge.load_state_dict(bridge_state(ours), strict=True)
    tokens = torch.randint(0, BRIDGE_CFG["d_vocab"], (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        bridge_logits, bridge_cache = bridge.run_with_cache(tokens)
        our_logits, our_cache = ours.run_with_cache(tokens)
    torch.testing.assert_close(our_logits, bridge_logits, **TOL)  # the twins really are one model
    return ours, our_logits, our_cache, bridge, bridge_cache, tokens


def small(name: str, **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(get_preset(name, **overrides)).eval()
    randomise_norms_and_biases(model)
    return model


def tokens_for(model: torch.nn.Module, batch: int = 2, pos: int = 10) -> torch.Tensor:
    gen = torch.Generator().manual_seed(5)
    return torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=gen)


# ---------------------------------------------------------------- the cache object


def test_run_with_cache_returns_an_activation_cache_and_a_dict_on_request(twins):
    model, _, cache, _, _, tokens = twins
    assert isinstance(cache, ActivationCache) and cache.model is model
    with torch.no_grad():
        _, plain = model.run_with_cache(tokens, return_cache_object=False)
        _, some = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    assert type(plain) is dict and set(plain) == set(cache.keys())
    assert set(some.keys()) == {f"blocks.{l}.attn.hook_pattern" for l in range(BRIDGE_CFG["n_layers"])}


def test_remove_batch_dim_drops_the_leading_one(twins):
    model, _, cache, _, _, tokens = twins
    with torch.no_grad():
        _, single = model.run_with_cache(tokens[:1], remove_batch_dim=True)
    assert not single.has_batch_dim
    assert single["pattern", 0].shape == cache["pattern", 0].shape[1:]
    torch.testing.assert_close(single["resid_post", 1], cache["resid_post", 1][0], **TOL)
    with pytest.raises(AssertionError, match="batch size 2"):
        model.run_with_cache(tokens, remove_batch_dim=True)


def test_shorthand_keys_are_the_full_hook_names(twins):
    _, _, cache, _, _, _ = twins
    assert torch.equal(cache["pattern", 0], cache["blocks.0.attn.hook_pattern"])
    assert torch.equal(cache["pattern", -1], cache["blocks.1.attn.hook_pattern"])
    assert torch.equal(cache["q", 1], cache["blocks.1.attn.hook_q"])
    assert torch.equal(cache["resid_mid", 0], cache["blocks.0.hook_resid_mid"])
    assert torch.equal(cache["embed"], cache["hook_embed"])


# ---------------------------------------------------------------- hand-computed identities


def test_accumulated_resid_ends_at_the_residual_and_reads_out_the_logits(twins):
    model, logits, cache, _, _, _ = twins
    resid, labels = cache.accumulated_resid(return_labels=True)
    assert labels == ["0_pre", "1_pre", "final_post"]
    assert torch.equal(resid[-1], cache["blocks.1.hook_resid_post"])
    torch.testing.assert_close(resid[0], cache["hook_embed"] + cache["hook_pos_embed"], **TOL)
    normed = cache.accumulated_resid(apply_ln=True)  # final LayerNorm recomputed per layer
    ln = model.ln_final
    torch.testing.assert_close(normed[-1], cache["ln_final.hook_normalized"] * ln.gamma + ln.beta, **TOL)
    torch.testing.assert_close(normed[-1] @ model.W_U + model.b_U, logits, **TOL)


def test_decompose_resid_sums_to_the_final_residual(twins):
    _, _, cache, _, _, _ = twins
    parts, labels = cache.decompose_resid(return_labels=True)
    assert labels == ["embed", "pos_embed", "0_attn_out", "0_mlp_out", "1_attn_out", "1_mlp_out"]
    torch.testing.assert_close(parts.sum(0), cache["resid_post", -1], **TOL)


def test_head_results_plus_b_O_are_the_attention_output(twins):
    model, _, cache, _, _, tokens = twins
    n_layers, n_heads = BRIDGE_CFG["n_layers"], BRIDGE_CFG["n_heads"]
    heads, labels = cache.stack_head_results(return_labels=True)  # [layer*head batch pos d_model]
    assert labels[:2] == ["L0H0", "L0H1"] and len(labels) == n_layers * n_heads
    per_layer = heads.unflatten(0, (n_layers, n_heads))
    model.set_use_attn_result(True)  # our own per-head route as the reference
    try:
        with torch.no_grad():
            _, with_result = model.run_with_cache(tokens)
    finally:
        model.set_use_attn_result(False)
    for l in range(n_layers):
        torch.testing.assert_close(per_layer[l].sum(0) + model.blocks[l].attn.b_O,
                                   cache["attn_out", l], **TOL)
        torch.testing.assert_close(per_layer[l], with_result["result", l].movedim(2, 0), **TOL)


def test_series_model_without_W_O_or_final_norm():
    """attn1_residual: one head writing its own slice (no W_O), no final norm, no biases."""
    model = small("attn1_residual_small")
    tokens = tokens_for(model)
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
    assert torch.equal(model.blocks[0].attn.W_O[0], torch.eye(model.cfg.d_model))
    torch.testing.assert_close(cache.stack_head_results().sum(0), cache["attn_out", 0], **TOL)
    resid = cache.accumulated_resid(apply_ln=True)  # no final norm: nothing to apply
    torch.testing.assert_close(resid[-1] @ model.W_U, logits, **TOL)
    torch.testing.assert_close(cache.decompose_resid().sum(0), cache["resid_post", 0], **TOL)


def test_rms_blocks_use_their_cached_scale():
    """transformer4_rms: apply_ln at a block's input divides by that block's cached RMS."""
    model = small("transformer4_rms_small")
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens_for(model))
    stack = cache.decompose_resid(layer=2)
    scaled = cache.apply_ln_to_stack(stack, layer=2)
    torch.testing.assert_close(scaled.sum(0), cache["blocks.2.ln1.hook_normalized"], **TOL)


def test_post_norm_refuses_apply_ln_in_one_line():
    model = small("transformer4_rms_small", norm_placement="post")
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens_for(model))
    with pytest.raises(ValueError, match="norm_placement='post'") as info:
        cache.decompose_resid(apply_ln=True)
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------- agreement with a bridge

CALLS = {
    "pattern": lambda c, t: c["pattern", 1],
    "accumulated_resid": lambda c, t: c.accumulated_resid(incl_mid=True),
    "accumulated_resid_ln": lambda c, t: c.accumulated_resid(apply_ln=True),
    "decompose_resid_ln": lambda c, t: c.decompose_resid(apply_ln=True),
    "decompose_resid_mlp_input": lambda c, t: c.decompose_resid(layer=1, mlp_input=True, apply_ln=True),
    "stack_head_results_ln": lambda c, t: c.stack_head_results(apply_ln=True, incl_remainder=True),
    "apply_ln_to_stack": lambda c, t: c.apply_ln_to_stack(c.decompose_resid(layer=1), layer=1),
    "logit_attrs": lambda c, t: c.logit_attrs(c.decompose_resid(apply_ln=True), t),
    "logit_diff_attrs": lambda c, t: c.logit_attrs(c.stack_head_results(), t[:, 0], t[:, 1]),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_same_calls_give_the_same_numbers_as_a_bridge(twins, call):
    _, _, our_cache, _, bridge_cache, tokens = twins
    ours_out, bridge_out = CALLS[call](our_cache, tokens), CALLS[call](bridge_cache, tokens)
    assert ours_out.shape == bridge_out.shape
    torch.testing.assert_close(ours_out, bridge_out, **TOL)


@pytest.mark.parametrize("name", ["W_Q", "W_K", "W_V", "W_O", "b_O"])
def test_weights_in_transformer_lens_shapes_match_the_bridge(twins, name):
    model, _, _, bridge, _, _ = twins
    torch.testing.assert_close(getattr(model, name), getattr(bridge, name))
    torch.testing.assert_close(getattr(model.blocks[1].attn, name), getattr(bridge.blocks[1].attn, name))


def test_views_leave_the_series_state_dict_names_alone(twins):
    model = twins[0]
    names = set(model.state_dict())
    assert "blocks.0.attention.heads.0.W_Q" in names and "blocks.0.attention.W_O" in names
    assert not any(".attn." in n or "tokenizer" in n for n in names)
    assert model.blocks[0].attn.hook_pattern is model.blocks[0].attention.hook_pattern


# ---------------------------------------------------------------- text in, other families


def test_text_goes_in_through_the_tokenizer_a_checkpoint_attaches():
    snap = load_checkpoint(SHIPPED)
    assert snap.model.tokenizer is snap.tokenizer
    assert set(snap.model.state_dict()) == set(build_model(snap.config).state_dict())
    with torch.no_grad():
        by_text_logits, by_text = snap.model.run_with_cache("ROMEO:")
        by_ids_logits, by_ids = snap.model.run_with_cache(snap.encode("ROMEO:"))
    assert torch.equal(by_text_logits, by_ids_logits)
    assert torch.equal(by_text["pattern", 3], by_ids["pattern", 3])
    e = snap.tokenizer.encode("e")[0]
    parts = by_text.decompose_resid()
    assert torch.equal(by_text.logit_attrs(parts, "e"), by_text.logit_attrs(parts, e))
    # no final norm: the attributions to "e" sum to its logit
    torch.testing.assert_close(by_text.logit_attrs(parts, "e").sum(0), by_text_logits[..., e], **TOL)


def test_text_without_a_tokenizer_is_a_one_line_error():
    model = small("transformer2_small")
    with pytest.raises(ValueError, match="no tokenizer") as info:
        model.run_with_cache("ROMEO:")
    assert "\n" not in str(info.value)


def test_mlp_family_gives_an_activation_cache_too():
    model = small("char_mlp_small")
    tokens = tokens_for(model, pos=model.cfg.n_ctx + 3)
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
    assert isinstance(cache, ActivationCache)
    assert torch.equal(cache["embed"], cache["hook_embed"])
    assert cache["hook_window"].shape[:2] == logits.shape[:2]
