"""probes.patching and probes.ablate on models with no hook points, through the tap: a user's GPT
with one module per head and one with an einsum, Hugging Face GPT-2 (its Conv1D projections), a
block that returns a delta its parent adds; each against patches written by hand with forward
hooks on the modules the test names itself, and a model it cannot patch refused in one line."""

from __future__ import annotations

import pytest
import torch
from close import assert_close_to_scale
from gpt_kit import HandEinsumGPT, MhaGPT, PerHeadGPT, hf_model
from torch import nn

from probes import ablate
from probes.common import ProbeInputError
from probes.patching import run

VOCAB = 12


def pair(vocab: int = VOCAB):
    gen = torch.Generator().manual_seed(2)
    clean = torch.randint(0, vocab, (2, 5), generator=gen)
    corrupt = clean.clone()
    corrupt[:, 1] = (corrupt[:, 1] + 1) % vocab
    return clean, corrupt


def logits(model, ids, hooks=()):
    handles = [register(model.get_submodule(name)) for name, register in hooks]
    try:
        with torch.no_grad():
            out = model(ids)
    finally:
        for h in handles:
            h.remove()
    return getattr(out, "logits", out)


def metric(out):  # [batch pos vocab] -> []
    return (out[:, -1, 3] - out[:, -1, 5]).mean()


def heads_by_hand(model, clean, corrupt, projection: str, n_layers: int, n_heads: int) -> torch.Tensor:
    """Each head's z (its slice of the output projection's input) at each position, clean into corrupt."""
    kept = {}
    hooks = [(projection.format(l), lambda m, l=l: m.register_forward_pre_hook(
        lambda mod, args: kept.__setitem__(l, args[0].clone()))) for l in range(n_layers)]
    logits(model, clean, hooks)
    out = torch.empty(n_layers, clean.shape[1], n_heads)
    for l in range(n_layers):
        width = kept[l].shape[-1] // n_heads
        for p in range(clean.shape[1]):
            for h in range(n_heads):
                def patch(mod, args, l=l, p=p, h=h):
                    x = args[0].clone()
                    x[:, p, h * width:(h + 1) * width] = kept[l][:, p, h * width:(h + 1) * width]
                    return (x,)
                hooks = [(projection.format(l), lambda m: m.register_forward_pre_hook(patch))]
                out[l, p, h] = metric(logits(model, corrupt, hooks))
    return out


def tiny_gpt2():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=16, n_layer=2, n_head=2)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg).eval()


@pytest.mark.parametrize("build, projection", [
    (lambda: PerHeadGPT(vocab=VOCAB), "trf_blocks.{}.att.out_proj"),
    (lambda: HandEinsumGPT(), "layers.{}.mix.to_out"),
    (tiny_gpt2, "transformer.h.{}.attn.c_proj"),
    (lambda: hf_model("llama"), "model.layers.{}.self_attn.o_proj"),
])
def test_heads_of_any_gpt_equal_hand_patches_on_its_projection(build, projection):
    torch.manual_seed(0)
    model = build().eval()
    with torch.no_grad():  # larger weights: sharper patterns, patches that differ
        for p in model.parameters():
            p.mul_(3.0 if p.dim() == 2 else 1.0)
    clean, corrupt = pair()
    ours = run(model, clean, corrupt, metric=metric, batch=4)
    n_layers, _, n_heads = ours.patched.shape
    assert_close_to_scale(ours.patched, heads_by_hand(model, clean, corrupt, projection, n_layers, n_heads), rel=1e-4)
    assert float(ours.patched.std()) > 1e-3  # the patches move the metric differently: a real test


class DeltaBlock(nn.Module):
    """A block that returns what its parent adds to the residual."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.inner = block

    def forward(self, x):
        return self.inner(x) - x


class DeltaGPT(HandEinsumGPT):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(DeltaBlock(block) for block in self.layers)

    def forward(self, ids):
        x = self.emb["tok"](ids) + self.emb["where"](torch.arange(ids.shape[1]))
        for layer in self.layers:
            x = x + layer(x)
        return self.out(self.final(x))


def by_position_by_hand(model, clean, corrupt, where: str, pre: bool) -> torch.Tensor:
    """One activation at one position, clean into corrupt: the input of `where` (pre) or its output."""
    n_layers, n = len(model.layers), clean.shape[1]
    kept, out = {}, torch.empty(n_layers, n)

    def hook_on(module, fn):
        return module.register_forward_pre_hook(fn) if pre else module.register_forward_hook(fn)
    logits(model, clean, [(where.format(l), lambda m, l=l: hook_on(
        m, lambda mod, args, *o: kept.__setitem__(l, (args[0] if pre else o[0]).clone()))) for l in range(n_layers)])
    for l in range(n_layers):
        for p in range(n):
            def patch(mod, args, *o, l=l, p=p):
                x = (args[0] if pre else o[0]).clone()
                x[:, p] = kept[l][:, p]
                return (x,) if pre else x
            out[l, p] = metric(logits(model, corrupt, [(where.format(l), lambda m: hook_on(m, patch))]))
    return out


def test_resid_attn_mlp_of_a_hand_gpt_and_of_its_delta_blocks():
    torch.manual_seed(0)
    model = HandEinsumGPT().eval()
    delta = DeltaGPT().eval()
    delta.load_state_dict({k.replace("layers.", "layers.").replace("layers.0.", "layers.0.inner.")
                          .replace("layers.1.", "layers.1.inner."): v for k, v in model.state_dict().items()})
    clean, corrupt = pair()
    for what, where, pre in (("resid", "layers.{}", True), ("attn", "layers.{}.mix", False),
                             ("mlp", "layers.{}.ff", False)):
        expected = by_position_by_hand(model, clean, corrupt, where, pre)
        assert_close_to_scale(run(model, clean, corrupt, metric=metric, what=what).patched, expected, rel=1e-4)
        assert_close_to_scale(run(delta, clean, corrupt, metric=metric, what=what).patched, expected, rel=1e-4)


def test_ablation_through_the_tap_equals_a_zeroed_slice_by_hand():
    torch.manual_seed(0)
    model = HandEinsumGPT().eval()
    tokens = pair()[0]
    result = ablate.run(model, tokens, heads=[(1, 1)])

    def zero(mod, args):
        x = args[0].clone()
        x[..., x.shape[-1] // 2:] = 0  # head 1 of 2
        return (x,)
    out = logits(model, tokens, [("layers.1.mix.to_out", lambda m: m.register_forward_pre_hook(zero))])
    assert result.together == pytest.approx(float(ablate.token_losses(out, tokens).mean()), rel=1e-5)


def test_a_model_whose_head_outputs_cannot_be_found_is_one_line():
    torch.manual_seed(0)
    model = MhaGPT().eval()
    clean, corrupt = pair()
    with pytest.raises(ProbeInputError, match="cannot patch heads of MhaGPT: no projection .* inside attns.0"):
        run(model, clean, corrupt, answer=3)
    assert run(model, clean, corrupt, answer=3, what="attn").patched.shape == (2, 5)
