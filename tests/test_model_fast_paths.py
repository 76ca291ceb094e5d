"""The unhooked model's fast paths: the packed q/k/v projection (its gradients per head and the
no-grad cache of its weight guard), the fused path's NaN/inf guard, and torch.compile (no graph breaks, same logits, hooks after compiling).

Compiled runs use the "aot_eager" backend: dynamo and AOTAutograd trace as for inductor, but no
C++ compiler is needed, so these tests run on any CI machine.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from models import build_model, get_preset
from probes.updates import named_trainable


def build(name: str = "tiny_shakespeare_gpt_small", **overrides):
    torch.manual_seed(0)
    return build_model(get_preset(name, dropout=0.0, **overrides)).eval()


def tokens_for(model, batch: int = 2) -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randint(0, model.cfg.d_vocab, (batch, model.cfg.n_ctx))


@pytest.mark.parametrize("name", ["tiny_shakespeare_gpt_small", "transformer4_rms_small"])
def test_training_gradients_reach_every_head(name):
    """A forward+backward through the fused projection gives each head's W_Q/K/V the gradient of a
    model that projects head by head (the per-head einsum written out here)."""
    model = build(name)
    tokens = tokens_for(model)
    F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten()).backward()
    attn = model.blocks[0].attention
    x = torch.randn(2, model.cfg.n_ctx, model.cfg.d_model)
    W = attn.qkv_weights()[0]  # the packed parameter, in the graph
    d_head, n = model.cfg.d_head, model.cfg.n_heads
    grads = named_trainable(model, grads=True)  # the model's own backward, one row per head
    for j in range(n):
        for kind in "QKV":
            g = grads[f"blocks.0.attention.heads.{j}.W_{kind}"]
            assert g is not None and g.shape == (model.cfg.d_model, d_head) and torch.isfinite(g).all()
    assert "blocks.0.attention.W_QKV" not in grads
    W.grad = None
    upstream = torch.randn(2, model.cfg.n_ctx, W.shape[1])
    (x @ W * upstream).sum().backward()
    for j, head in enumerate(attn.heads):
        cols = slice((n + j) * d_head, (n + j + 1) * d_head)  # K block after all heads' Q
        assert torch.allclose(W.grad[:, cols], torch.einsum("bpd,bpe->de", x, upstream[..., cols]), atol=1e-4)


def test_weight_guard_cache_follows_every_way_weights_change():
    """Without grad the weight guard is reused: the model's one guard on its logits while nothing
    is hooked, each layer's own under a hook; an in-place write, load_state_dict, a swapped
    parameter and a dtype change each give the same logits as a freshly built model, both ways."""
    model = build()
    tokens = tokens_for(model)
    attn, head = model.blocks[0].attention, model.blocks[0].attention.heads[1]
    hooked = [("blocks.0.hook_resid_pre", lambda x, hook: None)]
    with torch.no_grad():
        model(tokens)
        first = model._logits_guard[1]
        model(tokens)
        assert model._logits_guard[1] is first  # unchanged weights: reused, not rebuilt
        model.run_with_hooks(tokens, fwd_hooks=hooked)
        first = attn._guard_cache[2]
        model.run_with_hooks(tokens, fwd_hooks=hooked)
        assert attn._guard_cache[2] is first

        def check():
            fresh = build()
            fresh.load_state_dict(model.state_dict())
            fresh.to(next(model.parameters()).dtype)
            assert torch.equal(model(tokens), fresh(tokens))
            assert torch.equal(model.run_with_hooks(tokens, fwd_hooks=hooked), fresh.run_with_hooks(tokens, fwd_hooks=hooked))

        head.W_V.mul_(2.0)  # in place through the head's view, as an optimizer step
        check()
        head.W_K[0, 0] = float("nan")  # the guard must see it: a cached all-zero guard would not
        assert torch.isnan(model(tokens)).any()
        assert torch.isnan(model.run_with_hooks(tokens, fwd_hooks=hooked)).any()
        head.W_K[0, 0] = 0.0
        check()
        state = model.state_dict()
        state["blocks.0.attention.heads.1.W_Q"] = torch.randn_like(head.W_Q)
        model.load_state_dict(state)
        check()
        attn.W_QKV = torch.nn.Parameter(torch.randn_like(attn.W_QKV))  # a new parameter object
        check()
        model.double()  # .to(): parameter data swapped under the same objects
        check()


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_fused_path_shows_a_diverged_head(bad):
    """A non-finite weight in one head makes that head's z non-finite on the fused path, whatever
    SDPA does with such scores (PyTorch's CPU kernel returns zeros for some +-inf rows); other
    heads stay finite."""
    model = build("transformer4_rms_small")
    with torch.no_grad():
        model.blocks[0].attention.heads[2].W_K[0, 0] = bad
    model.set_attn_impl("fused")
    _, cache = model.run_with_cache(tokens_for(model), names_filter="blocks.0.attn.hook_z")
    z = cache["blocks.0.attn.hook_z"]  # [batch pos head d_head]
    assert not torch.isfinite(z[:, :, 2]).any(dim=-1).any()
    assert torch.isfinite(z[:, :, [0, 1, 3]]).all()


def test_a_diverged_bias_shows_on_the_fused_path():
    model = build("gpt2_124m_small")
    assert model.cfg.attn_bias
    with torch.no_grad():
        model.blocks[0].attention.heads[1].b_K[0] = float("inf")
    model.set_attn_impl("fused")
    _, cache = model.run_with_cache(tokens_for(model), names_filter="blocks.0.attn.hook_z")
    z = cache["blocks.0.attn.hook_z"]  # [batch pos head d_head]
    assert not torch.isfinite(z[:, :, 1]).any(dim=-1).any()
    assert torch.isfinite(z[:, :, 0]).all()


def test_a_hook_writing_inf_into_q_shows_on_the_fused_path():
    """Weights alone cannot show a value a hook wrote: with q or k hooked the guard sums them."""
    model = build("transformer4_rms_small")
    model.set_attn_impl("fused")

    def poison(q, hook):
        q = q.clone()
        q[:, 3, 1] = float("inf")  # [batch pos head d_head]: head 1 at position 3
        return q

    z = []
    with torch.no_grad(), model.hooks(fwd_hooks=[("blocks.0.attn.hook_q", poison),
                                ("blocks.0.attn.hook_z", lambda t, hook: z.append(t))]):
        model(tokens_for(model))
    assert not torch.isfinite(z[0][:, :, 1]).any(dim=-1).any()
    assert torch.isfinite(z[0][:, :, [0, 2, 3]]).all()


def test_a_diverged_head_makes_the_training_loss_nan():
    """With gradients on, the weight guard is recomputed from the live weights every step."""
    model = build("tiny_shakespeare_gpt_small").train()
    tokens = tokens_for(model)
    assert torch.isfinite(F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten()))
    with torch.no_grad():
        model.blocks[1].attention.heads[0].W_Q[3, 1] = float("inf")
    assert torch.isnan(F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten()))


def test_unhooked_model_compiles_without_graph_breaks():
    model = build()
    explanation = torch._dynamo.explain(model)(tokens_for(model))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


@pytest.mark.parametrize("name", ["tiny_shakespeare_gpt_small", "transformer4_rms_small"])
def test_compiled_logits_and_gradients_equal_eager(name):
    model = build(name)
    tokens = tokens_for(model)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        assert torch.allclose(compiled(tokens), model(tokens), atol=1e-5)
    F.cross_entropy(compiled(tokens).flatten(0, 1), tokens.flatten()).backward()
    compiled_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten()).backward()
    for n, p in model.named_parameters():
        assert torch.allclose(compiled_grads[n], p.grad, atol=1e-5), n


def test_hooks_added_after_compiling_fire_when_dynamo_guards_them(monkeypatch):
    """Dynamo by default skips guards on module hook dicts (skip_nnmodule_hook_guards), so a hook
    added after compiling would be ignored by the compiled callable; with those guards on, adding
    a hook recompiles and it fires (TransformerLens' hooks() and a plain torch hook alike), and
    removing it goes back. The eager model always sees its hooks (see models/transformer.py)."""
    monkeypatch.setattr(torch._dynamo.config, "skip_nnmodule_hook_guards", False)
    torch._dynamo.reset()  # code compiled by earlier tests carries no hook guards
    model = build()
    tokens = tokens_for(model)
    compiled = torch.compile(model, backend="aot_eager")
    with torch.no_grad():
        clean = compiled(tokens)
        seen = []
        with model.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", lambda x, hook: seen.append(x.shape))]):
            compiled(tokens)
        assert seen == [(2, model.cfg.n_heads, model.cfg.n_ctx, model.cfg.n_ctx)]
        handle = model.blocks[1].hook_resid_post.register_forward_hook(lambda mod, inp, out: out * 0)
        try:
            zeroed = compiled(tokens)
        finally:
            handle.remove()
        assert not torch.allclose(zeroed, clean)
        assert torch.allclose(compiled(tokens), clean, atol=1e-6)
        eager_seen = []
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_resid_pre", lambda x, hook: eager_seen.append(1))])
        assert eager_seen == [1]
