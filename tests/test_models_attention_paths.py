"""The two attention paths (explicit softmax, fused SDPA): they agree in logits and gradients, the
auto choice follows the hooks, pattern hooks refuse the fused path, and a NaN in a head shows on
both (the fused guard not overflowing in fp16).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from close import assert_close_to_scale
from models_kit import SMALL_TF, build, rand_tokens

import models.attention
from models import get_preset
from models.attention import Attention


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
