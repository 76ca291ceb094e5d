"""Probes run unchanged on our models and on a TransformerLens 4 `TransformerBridge`.

A tiny bridge is booted offline (`boot_native`, no download) with the dimensions of our
`tiny_shakespeare_gpt_small` twin; both are run with `run_with_cache` and every hook a probe
reads must exist in both, with the same shape and layout, and the same `cfg` fields.

Differences that probes must respect (checked or documented below):
- the bridge also exposes `*.hook_in/hook_out` and module aliases; ours only the TL names.
- `hook_attn_scores` is not portable: on ours it is the scaled, masked (-inf) pre-softmax score;
  TransformerLens 4.3's native bridge records the softmaxed pattern there. Probes read
  `hook_pattern` (and q/k if they need raw scores), never `hook_attn_scores`.
- both return a TransformerLens `ActivationCache` (shorthand keys such as `cache["pattern", 0]`,
  helpers such as `accumulated_resid`: see tests/test_activation_cache.py). Probes index by full
  hook name.
- MLP-family models have no attention: their cfg has no `n_layers`/`n_heads` (probes default
  them to 0 via `getattr(cfg, "n_layers", 0)`).
"""

from __future__ import annotations

import pytest
import torch

from models import MLPConfig, TransformerConfig, build_model, get_preset

BRIDGE_CFG = {"n_layers": 2, "d_model": 32, "n_heads": 4, "d_head": 8, "d_mlp": 64, "d_vocab": 50,
              "n_ctx": 16, "act_fn": "gelu", "normalization_type": "LN", "seed": 0}
BATCH, POS = 2, 12


def probe_hooks(n_layers: int) -> list[str]:
    """The hook names the probes read."""
    names = ["hook_embed", "ln_final.hook_scale", "ln_final.hook_normalized"]
    for l in range(n_layers):
        names += [f"blocks.{l}.attn.hook_{x}" for x in ("pattern", "q", "k", "v", "z")]
        names += [f"blocks.{l}.hook_resid_{x}" for x in ("pre", "mid", "post")]
    return names


@pytest.fixture(scope="module")
def bridge():
    from transformer_lens import TransformerBridge

    model = TransformerBridge.boot_native(dict(BRIDGE_CFG))
    model.eval()
    return model


@pytest.fixture(scope="module")
def ours():
    # our tiny_shakespeare_gpt twin already has the bridge's d_model/heads/d_head/d_mlp/n_ctx;
    # vocab, activation and layer count are set to the bridge's so that every shape can be compared
    cfg = get_preset("tiny_shakespeare_gpt_small", d_vocab=BRIDGE_CFG["d_vocab"],
                     act_fn=BRIDGE_CFG["act_fn"], n_layers=BRIDGE_CFG["n_layers"])
    for key in ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "n_ctx"):
        assert getattr(cfg, key) == BRIDGE_CFG[key], key
    torch.manual_seed(0)
    return build_model(cfg).eval()


@pytest.fixture(scope="module")
def tokens():
    gen = torch.Generator().manual_seed(3)
    return torch.randint(0, BRIDGE_CFG["d_vocab"], (BATCH, POS), generator=gen)


@pytest.fixture(scope="module")
def caches(bridge, ours, tokens):
    with torch.no_grad():
        bridge_logits, bridge_cache = bridge.run_with_cache(tokens)
        our_logits, our_cache = ours.run_with_cache(tokens)
    assert bridge_logits.shape == our_logits.shape == (BATCH, POS, BRIDGE_CFG["d_vocab"])
    return bridge_cache, our_cache


def expected_shape(name: str) -> tuple[int, ...]:
    d, h, dh = BRIDGE_CFG["d_model"], BRIDGE_CFG["n_heads"], BRIDGE_CFG["d_head"]
    if name.endswith("hook_pattern"):
        return (BATCH, h, POS, POS)  # [batch head q_pos k_pos]
    if name.endswith(("hook_q", "hook_k", "hook_v", "hook_z")):
        return (BATCH, POS, h, dh)  # [batch pos head d_head]
    if name.endswith("hook_scale"):
        return (BATCH, POS, 1)
    return (BATCH, POS, d)


def test_bridge_exposes_every_probe_hook_with_our_layout(caches):
    bridge_cache, our_cache = caches
    for name in probe_hooks(BRIDGE_CFG["n_layers"]):
        assert name in bridge_cache, f"bridge lacks {name}"
        assert name in our_cache, f"our model lacks {name}"
        assert tuple(bridge_cache[name].shape) == expected_shape(name), name
        assert tuple(our_cache[name].shape) == expected_shape(name), name


def test_probe_hook_names_are_a_subset_of_ours(bridge):
    names = set(probe_hooks(BRIDGE_CFG["n_layers"]))
    assert names <= set(bridge.hook_dict)
    # the preset itself, at the bridge's depth
    ours = build_model(get_preset("tiny_shakespeare_gpt_small", n_layers=BRIDGE_CFG["n_layers"]))
    assert names <= set(ours.hook_dict)
    # everything our model offers is spelled the TransformerLens way, so the bridge has it too
    assert set(ours.hook_dict) <= set(bridge.hook_dict)


@pytest.mark.parametrize("which", ["bridge", "ours"])
def test_pattern_semantics_agree(caches, which):
    """Causal, rows sum to 1, and pattern = softmax(q.k / sqrt(d_head)) over the causal prefix."""
    cache = caches[0] if which == "bridge" else caches[1]
    causal = torch.ones(POS, POS, dtype=torch.bool).triu(1)
    for l in range(BRIDGE_CFG["n_layers"]):
        pattern = cache[f"blocks.{l}.attn.hook_pattern"]
        assert (pattern[..., causal] == 0).all()
        torch.testing.assert_close(pattern.sum(-1), torch.ones(BATCH, BRIDGE_CFG["n_heads"], POS))
        q, k = cache[f"blocks.{l}.attn.hook_q"], cache[f"blocks.{l}.attn.hook_k"]
        scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / BRIDGE_CFG["d_head"] ** 0.5
        torch.testing.assert_close(pattern, scores.masked_fill(causal, float("-inf")).softmax(-1),
                                   atol=1e-5, rtol=1e-5)
        z = torch.einsum("bhqk,bkhe->bqhe", pattern, cache[f"blocks.{l}.attn.hook_v"])
        torch.testing.assert_close(cache[f"blocks.{l}.attn.hook_z"], z, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("which", ["bridge", "ours"])
def test_residual_and_norm_semantics_agree(caches, which):
    cache = caches[0] if which == "bridge" else caches[1]
    for l in range(BRIDGE_CFG["n_layers"]):
        pre = f"blocks.{l}."
        torch.testing.assert_close(cache[pre + "hook_resid_mid"],
                                   cache[pre + "hook_resid_pre"] + cache[pre + "hook_attn_out"],
                                   atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(cache[pre + "hook_resid_post"],
                                   cache[pre + "hook_resid_mid"] + cache[pre + "hook_mlp_out"],
                                   atol=1e-5, rtol=1e-5)
    last = cache[f"blocks.{BRIDGE_CFG['n_layers'] - 1}.hook_resid_post"]
    centred = last - last.mean(-1, keepdim=True)
    # ln_final.hook_scale is the LayerNorm's std (eps inside), hook_normalized is before gamma
    torch.testing.assert_close(cache["ln_final.hook_scale"],
                               (centred.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt(),
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache["ln_final.hook_normalized"],
                               centred / cache["ln_final.hook_scale"], atol=1e-5, rtol=1e-5)


def test_attn_scores_are_pre_softmax_on_ours(caches):
    """Ours: masked (-inf) scaled scores. Not asserted on the bridge (see module docstring)."""
    _, our_cache = caches
    scores = our_cache["blocks.0.attn.hook_attn_scores"]
    causal = torch.ones(POS, POS, dtype=torch.bool).triu(1)
    assert torch.isneginf(scores[..., causal]).all()
    torch.testing.assert_close(scores.softmax(-1), our_cache["blocks.0.attn.hook_pattern"])


def test_cfg_fields_the_probes_read(bridge, ours):
    for key in ("n_layers", "n_heads", "n_ctx", "d_vocab"):
        assert getattr(bridge.cfg, key) == BRIDGE_CFG[key], key
        assert getattr(ours.cfg, key) == BRIDGE_CFG[key], key
    for name in ("transformer2_small", "gpt2_124m_small", "attn1_noscale_small"):
        cfg = get_preset(name)
        assert isinstance(cfg, TransformerConfig)
        model = build_model(cfg)
        assert (model.cfg.n_layers, model.cfg.n_heads) == (cfg.n_layers, cfg.n_heads) > (0, 0)
        assert model.cfg.n_ctx == cfg.n_ctx and model.cfg.d_vocab == cfg.d_vocab


def test_mlp_family_has_no_attention_dims():
    """Documented gap: the MLP LM has n_ctx and d_vocab but no n_layers/n_heads (no attention), so
    the attention probes' source refuses it in one line."""
    from probes.common import ProbeInputError
    from probes.sources import source_of

    cfg = get_preset("char_mlp_small")
    assert isinstance(cfg, MLPConfig)
    model = build_model(cfg)
    assert model.cfg.n_ctx == cfg.n_ctx and model.cfg.d_vocab == cfg.d_vocab
    assert not hasattr(model.cfg, "n_layers") and not hasattr(model.cfg, "n_heads")
    assert not any("attn" in name for name in model.hook_dict)
    with pytest.raises(ProbeInputError, match="has no attention layers to probe") as err:
        source_of(model)
    assert "\n" not in str(err.value)


def test_full_hook_names_and_shorthand_keys_work_on_both(caches):
    bridge_cache, our_cache = caches
    name = "blocks.0.attn.hook_pattern"
    assert torch.equal(bridge_cache["pattern", 0], bridge_cache[name])
    assert torch.equal(our_cache["pattern", 0], our_cache[name])
    assert name in our_cache and name in bridge_cache
    assert set(probe_hooks(BRIDGE_CFG["n_layers"])) <= set(our_cache.keys())
