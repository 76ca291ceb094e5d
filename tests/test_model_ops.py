"""How many ops our unhooked model runs per pass against a plain nanoGPT-style module of the same
config (tests/plain_gpt.py): counted, not timed, so the comparison is exact on any machine.

With nothing hooked the model decides once per forward (`models.hooks.unobserved`): no layer asks
its hook points, and the q/k weights of every layer are guarded at once on the logits, so with
gradients on the guard costs one matmul per layer and two ops in all, not four to six per layer;
without, the guard is kept between forwards and costs its one add.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.modules import module as nn_module

from models import build_model, get_preset
from plain_gpt import PlainGPT, copy_weights, op_counts


def pair(**overrides):
    cfg = get_preset("tiny_shakespeare_gpt", dropout=0.0, **overrides)
    torch.manual_seed(0)
    ours, plain = build_model(cfg), PlainGPT(cfg)
    copy_weights(ours, plain)
    return cfg, ours, plain


@pytest.fixture(scope="module")
def tiny():
    cfg, ours, plain = pair()
    tokens = torch.randint(0, cfg.d_vocab, (1, cfg.n_ctx), generator=torch.Generator().manual_seed(0))
    return ours, plain, tokens


@pytest.mark.parametrize("grad, backward", [(False, False), (True, False), (True, True)],
                         ids=["forward", "forward with grad", "forward and backward"])
def test_ours_runs_at_most_five_percent_more_ops_than_plain(tiny, grad, backward):
    ours, plain, tokens = tiny
    with torch.no_grad():
        assert torch.allclose(ours(tokens), plain(tokens), atol=1e-5)  # one function, two modules
    mine, theirs = (op_counts(m.train(grad), tokens, grad, backward) for m in (ours, plain))
    assert mine["profiler"] <= 1.05 * theirs["profiler"], (mine, theirs)
    if not grad:  # the guard is kept while the weights are unchanged: one add on the logits
        assert mine["kernels"] == theirs["kernels"] + 1
    elif backward:  # a training step: the guard's launches are a few in ~130
        assert mine["kernels"] <= 1.05 * theirs["kernels"], (mine, theirs)


def test_the_training_guard_adds_one_launch_per_layer_and_two_in_all():
    """With gradients on, each layer's q/k sums are one matmul, then one dot and one add for the
    whole model (the guard per layer it replaced took four more each)."""
    extra = {}
    for layers in (2, 4):
        cfg, ours, plain = pair(n_layers=layers)
        tokens = torch.randint(0, cfg.d_vocab, (1, cfg.n_ctx))
        mine, theirs = (op_counts(m.train(), tokens, grad=True) for m in (ours, plain))
        extra[layers] = mine["kernels"] - theirs["kernels"]
    assert extra == {2: 2 + 2, 4: 4 + 2}


def test_a_hook_added_after_an_unhooked_forward_is_seen(tiny):
    """The "nothing hooked" answer is kept until a hook is registered anywhere: a torch hook on a
    hook point, on a block (not a hook point) and a global module hook each fire at once, give the
    same logits, and once removed the lean pass is back (fewer ops than with a hook on)."""
    ours, _, tokens = tiny
    ours.eval()
    with torch.no_grad():
        clean = ours(tokens)
        seen: list[str] = []
        hookers = {"point": lambda fn: ours.blocks[0].hook_resid_pre.register_forward_hook(fn),
                   "block": lambda fn: ours.blocks[1].register_forward_hook(fn),
                   "global": nn_module.register_module_forward_hook}
        for name, register in hookers.items():
            handle = register(lambda module, args, out, name=name: seen.append(name))
            try:
                assert torch.allclose(ours(tokens), clean, atol=1e-5), name  # a global hook: explicit attention
            finally:
                handle.remove()
    assert seen[:2] == ["point", "block"] and set(seen[2:]) == {"global"}  # a global hook fires per module
    unhooked = op_counts(ours.train(), tokens, grad=True)["kernels"]
    handle = ours.blocks[0].hook_resid_pre.register_forward_hook(lambda *args: None)
    try:
        hooked = op_counts(ours, tokens, grad=True)["kernels"]
    finally:
        handle.remove()
    assert hooked > unhooked == op_counts(ours, tokens, grad=True)["kernels"]


@pytest.mark.parametrize("preset, where, bad", [("gpt2_124m_small", "b_K", float("inf")),  # SDPA hides these two
                                                ("gpt2_124m_small", "b_Q", -float("inf")),
                                                ("tiny_shakespeare_gpt_small", "W_K", float("nan"))])
def test_the_guard_on_the_logits_shows_a_diverged_head_as_the_explicit_path_does(preset, where, bad):
    """Unhooked, with gradients on, the fused path's one guard for the model makes the logits
    non-finite exactly where the explicit path (scores, softmax: nothing hidden) does."""
    torch.manual_seed(0)
    model = build_model(get_preset(preset, dropout=0.0)).train()
    tokens = torch.randint(0, model.cfg.d_vocab, (2, model.cfg.n_ctx))
    with torch.no_grad():
        getattr(model.blocks[-1].attention.heads[1], where)[0] = bad
    fused = model(tokens)
    model.set_attn_impl("explicit")
    explicit = model(tokens)
    assert not torch.isfinite(explicit).all()
    assert torch.equal(torch.isfinite(fused), torch.isfinite(explicit))
