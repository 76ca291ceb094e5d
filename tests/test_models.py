"""Models: presets, parameter counts, hooks, interventions, the two attention paths, configs,
input checks, norm placement, tied unembedding and the MLP LM's sliding window.

Everything runs on the `_small` twins (d 32, ctx 16) except parameter counts, which build the
FULL presets on the meta device (no memory, no init cost) and compare with hand-derived formulas
and with the numbers the series and the blog feed print.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F
from close import assert_close_to_scale
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import models.attention
from models import (PRESETS, MLPConfig, TransformerConfig, build_model, config_from_dict,
                    get_preset, list_presets)
from models.attention import Attention

ALL = list_presets()
FULL = [n for n in ALL if not n.endswith("_small")]
SMALL = [n for n in ALL if n.endswith("_small")]
SMALL_TF = [n for n in SMALL if isinstance(get_preset(n), TransformerConfig)]
SMALL_MLP = [n for n in SMALL if isinstance(get_preset(n), MLPConfig)]

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MODEL_PROPERTY = settings(max_examples=15, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])


def build(cfg_or_name, seed: int = 0, **overrides):
    """A model in eval mode (dropout off), deterministically initialised."""
    cfg = get_preset(cfg_or_name, **overrides) if isinstance(cfg_or_name, str) else cfg_or_name
    torch.manual_seed(seed)
    return build_model(cfg).eval()


def rand_tokens(cfg, batch: int = 2, pos: int | None = None, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.d_vocab, (batch, pos or cfg.n_ctx), generator=gen)


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------------------------
# presets
# --------------------------------------------------------------------------------------------

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


def expected_params(cfg) -> int:
    """Parameter count derived by hand from the architecture (not from the code)."""
    if isinstance(cfg, MLPConfig):
        V, e, H, k = cfg.d_vocab, cfg.d_embed, cfg.d_hidden, cfg.n_hidden_layers
        return V * e + (cfg.n_ctx * e * H + H) + (k - 1) * (H * H + H) + (H * V + V)
    d, V, n, L = cfg.d_model, cfg.d_vocab, cfg.n_ctx, cfg.n_layers
    h, dh, dm, depth = cfg.n_heads, cfg.d_head, cfg.d_mlp, cfg.mlp_depth
    norm = {"none": 0, "rms": d, "layer": 2 * d}[cfg.norm]
    attn = 3 * h * d * dh + (3 * h * dh if cfg.attn_bias else 0)
    if cfg.attn_out_proj:
        attn += h * dh * d + (d if cfg.attn_bias or cfg.attn_out_bias else 0)
    d_out = V if cfg.unembed == "mlp" else d
    mlp = d * dm + (depth - 1) * dm * dm + dm * d_out
    if cfg.mlp_bias:
        mlp += depth * dm + d_out
    total = V * d + L * (attn + mlp + 2 * norm)
    total += n * d if cfg.pos_embed == "learned" else 0
    total += d * V if cfg.unembed == "separate" else 0
    total += V if cfg.unembed_bias else 0
    total += norm if cfg.final_norm else 0
    return total


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


# --------------------------------------------------------------------------------------------
# the hook walk
# --------------------------------------------------------------------------------------------

def expected_hooks(cfg: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """Every hook that fires by default (hook_result needs set_use_attn_result), with shapes."""
    b, p, d, h, dh = 2, cfg.n_ctx, cfg.d_model, cfg.n_heads, cfg.d_head
    d_last = cfg.d_vocab if cfg.unembed == "mlp" else d
    shapes: dict[str, tuple[int, ...]] = {"hook_embed": (b, p, d)}
    if cfg.pos_embed == "learned":
        shapes["hook_pos_embed"] = (b, p, d)
    for l in range(cfg.n_layers):
        pre = f"blocks.{l}."
        shapes[pre + "hook_resid_pre"] = (b, p, d)
        for name in ("q", "k", "v", "z"):
            shapes[f"{pre}attn.hook_{name}"] = (b, p, h, dh)
        shapes[pre + "attn.hook_attn_scores"] = (b, h, p, p)
        shapes[pre + "attn.hook_pattern"] = (b, h, p, p)
        shapes[pre + "hook_attn_out"] = (b, p, d)
        shapes[pre + "hook_resid_mid"] = (b, p, d)
        for i in range(cfg.mlp_depth):
            suffix = "" if i == 0 else f"_{i}"
            shapes[f"{pre}mlp.hook_pre{suffix}"] = (b, p, cfg.d_mlp)
            shapes[f"{pre}mlp.hook_post{suffix}"] = (b, p, cfg.d_mlp)
        shapes[pre + "hook_mlp_out"] = (b, p, d_last)
        shapes[pre + "hook_resid_post"] = (b, p, d_last)
        if cfg.norm != "none":
            for ln in ("ln1", "ln2"):
                shapes[f"{pre}{ln}.hook_scale"] = (b, p, 1)
                shapes[f"{pre}{ln}.hook_normalized"] = (b, p, d)
    if cfg.final_norm:
        shapes["ln_final.hook_scale"] = (b, p, 1)
        shapes["ln_final.hook_normalized"] = (b, p, d)
    return shapes


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


# --------------------------------------------------------------------------------------------
# the two attention paths
# --------------------------------------------------------------------------------------------

def logits_and_grads(model, toks, impl):
    model.set_attn_impl(impl)
    model.zero_grad(set_to_none=True)
    logits = model(toks)
    target = torch.roll(toks, -1, dims=1)
    F.cross_entropy(logits.flatten(0, 1), target.flatten()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return logits.detach(), grads


@pytest.mark.parametrize("name", SMALL_TF)
def test_explicit_and_fused_paths_agree(name):
    cfg = get_preset(name)
    model = build(name)
    toks = rand_tokens(cfg, batch=3)
    logits_e, grads_e = logits_and_grads(model, toks, "explicit")
    logits_f, grads_f = logits_and_grads(model, toks, "fused")
    assert_close_to_scale(logits_f, logits_e)
    assert grads_e.keys() == grads_f.keys()
    for key in grads_e:
        scale = max(1.0, grads_e[key].abs().max().item())
        torch.testing.assert_close(grads_f[key], grads_e[key], atol=1e-5 * scale, rtol=1e-4,
                                   msg=lambda m, key=key: f"{key}: {m}")
    # shorter sequences too (the fused path's causal mask must match the sliced buffer)
    model.set_attn_impl("explicit")
    short_e = model(toks[:, :7])
    model.set_attn_impl("fused")
    assert_close_to_scale(model(toks[:, :7]), short_e)


class PathSpy:
    """Counts calls of Attention.explicit / Attention.fused and of F.scaled_dot_product_attention."""

    def __init__(self, monkeypatch):
        self.calls = {"explicit": 0, "fused": 0, "sdpa": 0}
        for which in ("explicit", "fused"):
            original = getattr(Attention, which)

            def spy(self_, *args, _which=which, _orig=original):
                self.calls[_which] += 1
                return _orig(self_, *args)

            monkeypatch.setattr(Attention, which, spy)
        sdpa = models.attention.F.scaled_dot_product_attention

        def sdpa_spy(*args, **kwargs):
            self.calls["sdpa"] += 1
            return sdpa(*args, **kwargs)

        monkeypatch.setattr(models.attention.F, "scaled_dot_product_attention", sdpa_spy)

    def take(self) -> dict[str, int]:
        out = dict(self.calls)
        self.calls.update(explicit=0, fused=0, sdpa=0)
        return out


def test_auto_path_choice_is_driven_by_hooks(monkeypatch):
    name = "transformer4_rms_small"
    cfg = get_preset(name)
    L = cfg.n_layers
    model = build(name)
    toks = rand_tokens(cfg)
    spy = PathSpy(monkeypatch)

    model(toks)  # auto, nothing hooked: fused everywhere
    assert spy.take() == {"explicit": 0, "fused": L, "sdpa": L}

    model.run_with_hooks(toks, fwd_hooks=[("blocks.0.attn.hook_pattern", lambda x, hook: None)])
    assert spy.take() == {"explicit": 1, "fused": L - 1, "sdpa": L - 1}  # only layer 0 switches

    model.run_with_hooks(toks, fwd_hooks=[("blocks.1.attn.hook_attn_scores", lambda x, hook: None)])
    assert spy.take() == {"explicit": 1, "fused": L - 1, "sdpa": L - 1}

    model.run_with_cache(toks)  # caching everything reads every pattern
    assert spy.take() == {"explicit": L, "fused": 0, "sdpa": 0}

    model.run_with_cache(toks, names_filter=lambda nm: nm.endswith(("hook_z", "hook_q")))
    assert spy.take() == {"explicit": 0, "fused": L, "sdpa": L}  # q/z hooks do not need scores

    model(toks)  # hooks are gone again after run_with_hooks / run_with_cache
    assert spy.take() == {"explicit": 0, "fused": L, "sdpa": L}

    model.set_attn_impl("explicit")
    model(toks)
    assert spy.take() == {"explicit": L, "fused": 0, "sdpa": 0}


def test_backward_hook_on_pattern_forces_explicit(monkeypatch):
    name = "transformer2_small"
    cfg = get_preset(name)
    model = build(name)
    toks = rand_tokens(cfg)
    spy = PathSpy(monkeypatch)
    grads = []
    with model.hooks(bwd_hooks=[("blocks.1.attn.hook_pattern", lambda g, hook: grads.append(g.shape))]):
        model(toks).sum().backward()
    assert spy.take()["explicit"] == 1
    assert grads == [(2, cfg.n_heads, cfg.n_ctx, cfg.n_ctx)]


def test_plain_torch_hook_counts_as_hooked(monkeypatch):
    model = build("mha4_small")
    spy = PathSpy(monkeypatch)
    seen = []
    handle = model.blocks[0].attention.hook_pattern.register_forward_hook(
        lambda mod, inp, out: seen.append(out.shape))
    try:
        model(rand_tokens(get_preset("mha4_small")))
    finally:
        handle.remove()
    assert seen and spy.take()["explicit"] == 1


def test_fused_impl_refuses_pattern_hooks():
    name = "transformer2_small"
    cfg = get_preset(name)
    model = build(name)
    toks = rand_tokens(cfg)
    model.set_attn_impl("fused")
    with pytest.raises(RuntimeError, match="fused"):
        model.run_with_hooks(toks, fwd_hooks=[("blocks.0.attn.hook_pattern", lambda x, hook: None)])
    with pytest.raises(RuntimeError, match="fused"):
        model.run_with_cache(toks)
    # the failed runs left no hooks behind; unrelated hooks are fine on the fused path
    assert not any(h.has_hooks() for h in model.hook_dict.values())
    out = model.run_with_hooks(toks, fwd_hooks=[("blocks.0.attn.hook_z", lambda x, hook: None)])
    assert out.shape == (2, cfg.n_ctx, cfg.d_vocab)
    with pytest.raises(ValueError, match="impl"):
        model.set_attn_impl("flash")


# --------------------------------------------------------------------------------------------
# config validation
# --------------------------------------------------------------------------------------------

TF_BASE = get_preset("transformer4_rms_small")
MLP_BASE = get_preset("char_mlp_small")


@pytest.mark.parametrize("changes, field", [
    (dict(attn_scale="sqrt"), "attn_scale"),
    (dict(n_heads=0), "n_heads"),
    (dict(d_head=-4), "d_head"),
    (dict(n_layers=1.5), "n_layers"),
    (dict(d_model=True), "d_model"),
    (dict(dropout=1.5), "dropout"),
    (dict(dropout=1.0), "dropout"),
    (dict(dropout=-0.1), "dropout"),
    (dict(dropout=float("nan")), "dropout"),
    (dict(norm="batch"), "norm"),
    (dict(norm_placement="sandwich"), "norm_placement"),
    (dict(norm_eps=0.0), "norm_eps"),
    (dict(act_fn="swish"), "act_fn"),
    (dict(pos_embed="rope"), "pos_embed"),
    (dict(init="xavier"), "init"),
    (dict(unembed="mlp"), "unembed"),  # with residual=True and 2 layers
    (dict(unembed="mlp", residual=False, n_layers=1, attn_out_proj=True, norm="none",
          n_heads=1, d_head=32, mlp_depth=1), None),  # a valid combination, for contrast
    (dict(norm="none", final_norm=True), "final_norm"),
    (dict(attn_out_proj=False), None),  # 4 * 8 == 32: allowed
    (dict(attn_out_proj=False, d_head=4), "attn_out_proj"),
])
def test_transformer_config_errors_name_the_field(changes, field):
    if field is None:
        TF_BASE.replace(**changes)
        return
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        TF_BASE.replace(**changes)


@pytest.mark.parametrize("changes, field", [
    (dict(d_embed=0), "d_embed"), (dict(n_ctx=-1), "n_ctx"), (dict(n_hidden_layers=0),
                                                                "n_hidden_layers"),
    (dict(act_fn="softplus"), "act_fn"), (dict(dropout=2), "dropout"),
])
def test_mlp_config_errors_name_the_field(changes, field):
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        MLP_BASE.replace(**changes)


POSITIVE_TF = ["d_vocab", "n_ctx", "d_model", "n_layers", "n_heads", "d_head", "d_mlp", "mlp_depth"]


@FAST
@given(field=st.sampled_from(POSITIVE_TF), value=st.integers(max_value=0))
def test_nonpositive_sizes_rejected(field, value):
    with pytest.raises(ValueError, match=rf"TransformerConfig\.{field} must be a positive int"):
        TF_BASE.replace(**{field: value})


@FAST
@given(value=st.floats(allow_nan=True, allow_infinity=True))
def test_dropout_must_be_a_probability(value):
    if 0.0 <= value < 1.0:
        assert TF_BASE.replace(dropout=value).dropout == value
        assert MLP_BASE.replace(dropout=value).dropout == value
    else:
        with pytest.raises(ValueError, match="dropout"):
            TF_BASE.replace(dropout=value)
        with pytest.raises(ValueError, match="dropout"):
            MLP_BASE.replace(dropout=value)


@FAST
@given(field=st.sampled_from(["act_fn", "attn_scale", "norm", "norm_placement", "pos_embed",
                              "unembed", "init"]),
       value=st.one_of(st.text(max_size=12), st.none(), st.integers()))
def test_choice_fields_reject_anything_else(field, value):
    from models import config as config_mod
    choices = {"act_fn": config_mod.ACT_FNS, "attn_scale": config_mod.ATTN_SCALES,
               "norm": config_mod.NORMS, "norm_placement": config_mod.NORM_PLACEMENTS,
               "pos_embed": config_mod.POS_EMBEDS, "unembed": config_mod.UNEMBEDS,
               "init": config_mod.INITS}[field]
    if value in choices:
        return
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        TF_BASE.replace(**{field: value})


@pytest.mark.parametrize("field", ["residual", "final_norm", "attn_out_proj", "attn_bias", "mlp_bias", "norm_bias"])
@pytest.mark.parametrize("value", ["no", "False", 0, 1, None])
def test_bool_switches_reject_non_bools(field, value):
    """residual='no' (a CLI override, a hand-edited config.json) must not be truthy-True."""
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        get_preset("tiny_shakespeare_gpt_small").replace(**{field: value})


@pytest.mark.parametrize("changes", [dict(norm="rms", final_norm=True),
                                     dict(norm="layer", norm_placement="post"),
                                     dict(norm="rms", norm_placement="post")])
def test_mlp_unembed_refuses_a_norm_after_the_vocab_wide_mlp(changes):
    """The last MLP outputs d_vocab; a d_model-wide norm after it is refused at config time
    (it used to crash in forward with a shape RuntimeError)."""
    with pytest.raises(ValueError, match="unembed"):
        get_preset("attn1_sqrtd_small").replace(**changes)
    # pre-norm inside the block is fine
    cfg = get_preset("attn1_sqrtd_small").replace(norm=changes["norm"], norm_placement="pre")
    assert build(cfg)(rand_tokens(cfg)).shape == (2, cfg.n_ctx, cfg.d_vocab)


def test_configs_are_frozen_and_replace_revalidates():
    with pytest.raises(dataclasses.FrozenInstanceError):
        TF_BASE.n_heads = 2  # type: ignore[misc]
    with pytest.raises(ValueError, match="n_heads"):
        TF_BASE.replace(n_heads=0)
    assert TF_BASE.replace(n_heads=2, d_head=16).d_attn == 32


@pytest.mark.parametrize("name", ALL)
def test_config_dict_round_trip(name):
    cfg = get_preset(name)
    data = cfg.to_dict()
    assert data["family"] == ("mlp" if isinstance(cfg, MLPConfig) else "transformer")
    assert config_from_dict(data) == cfg
    assert config_from_dict(json.loads(json.dumps(data))) == cfg  # survives a checkpoint's JSON
    assert type(config_from_dict(data)) is type(cfg)


def test_config_from_dict_errors():
    data = TF_BASE.to_dict()
    with pytest.raises(ValueError, match="unknown model family 'rnn'"):
        config_from_dict({**data, "family": "rnn"})
    with pytest.raises(ValueError, match="unknown model family None"):
        config_from_dict({k: v for k, v in data.items() if k != "family"})
    with pytest.raises(ValueError, match=r"unknown transformer config field\(s\) \['n_experts'\]"):
        config_from_dict({**data, "n_experts": 8})
    with pytest.raises(ValueError, match=r"missing field\(s\) \['d_model'\]"):
        config_from_dict({k: v for k, v in data.items() if k != "d_model"})
    with pytest.raises(ValueError, match="JSON object"):
        config_from_dict([("family", "mlp")])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n_heads"):
        config_from_dict({**data, "n_heads": 0})
    mlp_data = MLP_BASE.to_dict()
    with pytest.raises(ValueError, match=r"unknown mlp config field\(s\) \['n_layers'\]"):
        config_from_dict({**mlp_data, "n_layers": 2})
    with pytest.raises(ValueError, match="build_model needs"):
        build_model(data)  # type: ignore[arg-type]


# a valid random transformer: every switch, small sizes
@st.composite
def small_transformer_configs(draw):
    n_heads = draw(st.sampled_from([1, 2, 4]))
    d_model = draw(st.sampled_from([8, 16]))
    residual = draw(st.booleans())
    n_layers = draw(st.integers(1, 2))
    unembed = draw(st.sampled_from(["separate", "tied"] + (["mlp"] if not residual else [])))
    if unembed == "mlp":
        n_layers = 1
    attn_out_proj = draw(st.booleans())
    d_head = d_model // n_heads if not attn_out_proj else draw(st.sampled_from([4, d_model]))
    norm = draw(st.sampled_from(["none", "rms", "layer"]))
    placement = draw(st.sampled_from(["pre", "post"]))
    final_norm = norm != "none" and draw(st.booleans())
    if unembed == "mlp":  # a d_model-wide norm after the vocab-wide MLP is refused (above)
        placement, final_norm = "pre", False
    return TransformerConfig(
        d_vocab=draw(st.integers(2, 40)), n_ctx=draw(st.integers(1, 9)), d_model=d_model,
        n_layers=n_layers, n_heads=n_heads, d_head=d_head, d_mlp=draw(st.sampled_from([8, 24])),
        mlp_depth=draw(st.integers(1, 3)), act_fn=draw(st.sampled_from(["relu", "gelu", "tanh"])),
        attn_scale=draw(st.sampled_from(["none", "sqrt_d_model", "sqrt_d_head"])),
        residual=residual, norm=norm, norm_placement=placement, final_norm=final_norm,
        attn_out_proj=attn_out_proj, attn_bias=draw(st.booleans()), mlp_bias=draw(st.booleans()),
        pos_embed=draw(st.sampled_from(["learned", "none"])), unembed=unembed,
        init=draw(st.sampled_from(["series", "gpt2"])))


@MODEL_PROPERTY
@given(cfg=small_transformer_configs(), batch=st.integers(1, 3))
def test_any_valid_config_builds_runs_and_paths_agree(cfg, batch):
    model = build(cfg)
    assert n_params(model) == expected_params(cfg)
    toks = rand_tokens(cfg, batch=batch)
    model.set_attn_impl("explicit")
    logits_e = model(toks)
    model.set_attn_impl("fused")
    logits_f = model(toks)
    assert logits_e.shape == (batch, cfg.n_ctx, cfg.d_vocab)
    assert_close_to_scale(logits_f, logits_e)
    assert config_from_dict(cfg.to_dict()) == cfg
    model.set_attn_impl("auto")
    _, cache = model.run_with_cache(toks)
    assert set(cache.keys()) == set(expected_hooks(cfg))


# --------------------------------------------------------------------------------------------
# bad input to forward
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["transformer2_small", "char_mlp_small"])
def test_bad_tokens_raise_value_error(name):
    cfg = get_preset(name)
    model = build(name)
    good = rand_tokens(cfg)
    bad_id = good.clone()
    bad_id[0, 3] = cfg.d_vocab
    with pytest.raises(ValueError, match=rf"token id {cfg.d_vocab} is outside the vocabulary \[0, {cfg.d_vocab}\)"):
        model(bad_id)
    bad_id[0, 3] = -1
    with pytest.raises(ValueError, match=r"token id -1 is outside the vocabulary"):
        model(bad_id)
    with pytest.raises(ValueError, match="integer ids, got dtype torch.float32"):
        model(good.float())
    with pytest.raises(ValueError, match="integer ids"):
        model(good > 3)
    with pytest.raises(ValueError, match=r"shape \[batch pos\], got \(2, 1, "):
        model(good.unsqueeze(1))
    with pytest.raises(ValueError, match="torch.Tensor"):
        model(good.tolist())
    # a 1-D sequence is one batch row; int32 ids are fine
    assert model(good[0]).shape[0] == 1
    torch.testing.assert_close(model(good.int()), model(good))


def test_too_long_sequence_names_the_context():
    cfg = get_preset("transformer2_small")
    model = build(cfg)
    with pytest.raises(ValueError, match=rf"sequence of {cfg.n_ctx + 1} tokens is longer than the "
                                         rf"model's context of {cfg.n_ctx}"):
        model(rand_tokens(cfg, pos=cfg.n_ctx + 1))
    with pytest.raises(ValueError, match="at least 1 token"):
        model(torch.zeros(2, 0, dtype=torch.long))


def test_mlp_lm_needs_a_full_window():
    cfg = get_preset("char_mlp_small")
    with pytest.raises(ValueError, match=rf"at least {cfg.n_ctx} token"):
        build(cfg)(rand_tokens(cfg, pos=cfg.n_ctx - 1))


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


# --------------------------------------------------------------------------------------------
# the MLP LM
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", SMALL_MLP)
def test_mlp_lm_slides_its_window(name):
    cfg = get_preset(name)
    model = build(name)
    pos = cfg.n_ctx + 5
    toks = rand_tokens(cfg, batch=3, pos=pos)
    out = model(toks)
    assert out.shape == (3, pos - cfg.n_ctx + 1, cfg.d_vocab)
    windows = torch.cat([model(toks[:, i:i + cfg.n_ctx]) for i in range(pos - cfg.n_ctx + 1)], dim=1)
    torch.testing.assert_close(out, windows, atol=1e-5, rtol=1e-5)
    # one window is the series' model: embeddings concatenated in order, then the MLP
    first = toks[:, :cfg.n_ctx]
    series_style = model.mlp(model.embedding(first).view(3, -1))
    torch.testing.assert_close(model(first)[:, 0], series_style, atol=1e-5, rtol=1e-5)


def test_mlp_lm_hooks_and_dims():
    cfg = get_preset("token_mlp_small")
    model = build(cfg)
    toks = rand_tokens(cfg, pos=cfg.n_ctx + 2)
    _, cache = model.run_with_cache(toks)
    shapes = {k: tuple(v.shape) for k, v in cache.items()}
    want = {"hook_embed": (2, cfg.n_ctx + 2, cfg.d_embed), "hook_window": (2, 3, cfg.d_input)}
    for i in range(cfg.n_hidden_layers):
        suffix = "" if i == 0 else f"_{i}"
        want[f"mlp.hook_pre{suffix}"] = want[f"mlp.hook_post{suffix}"] = (2, 3, cfg.d_hidden)
    assert shapes == want
    assert not any("attn" in k for k in model.hook_dict)
    # the MLP family has no layers of attention: no n_layers / n_heads (probes treat that as 0)
    assert not hasattr(cfg, "n_layers") and not hasattr(cfg, "n_heads")
    assert model.cfg.n_ctx == cfg.n_ctx and model.cfg.d_vocab == cfg.d_vocab


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


@pytest.mark.parametrize("impl", ["explicit", "fused"])
def test_nan_in_a_head_shows_on_both_attention_paths(impl):
    """PyTorch's CPU SDPA returns zeros for NaN scores; the fused path must not hide divergence."""
    model = build("transformer4_rms_small").eval()
    with torch.no_grad():
        model.blocks[0].attention.heads[2].W_K[0, 0] = float("nan")
    model.set_attn_impl(impl)
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 8))
    _, cache = model.run_with_cache(tokens, names_filter="blocks.0.attn.hook_z")
    z = cache["blocks.0.attn.hook_z"]  # [batch pos head d_head]
    assert not torch.isfinite(z[:, :, 2]).any()
    assert torch.isfinite(z[:, :, [0, 1, 3]]).all()


def test_fused_nan_guard_does_not_overflow_in_fp16():
    """The guard sums q and k; in fp16 healthy activations could overflow to inf, and inf * 0 = NaN."""
    attn = build("transformer4_rms_small").blocks[0].attention
    q = torch.full((1, 128, 4, 8), 60.0, dtype=torch.half)  # [batch pos head d_head]: sum 61440, q + k > fp16 max
    z = attn.fused(q, q.clone(), torch.ones_like(q))
    assert torch.isfinite(z).all()
