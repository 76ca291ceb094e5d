"""Attribution patching (AtP) against a gradient product written by hand, and the AtP* QK fix on a
hand-set model where the answer is known on paper: plain AtP overshoots a saturating softmax, AtP*
equals exact patching."""

from __future__ import annotations

import math

import pytest
import torch
from close import assert_close_to_scale
from test_patching import blank_model, gpt, logit_diff, pair  # noqa: F401  (fixtures: a sharp 2-layer GPT, inputs)

from models import TransformerConfig, build_model
from probes.common import ProbeInputError
from probes.patching import run

HOOK = {"heads": "blocks.{}.attn.hook_z", "resid": "blocks.{}.hook_resid_pre"}


def by_hand(model, base, donor, what):
    """metric(base) + sum over batch and features of (a_donor - a_base) * d metric / d a_base."""
    names = [HOOK[what].format(l) for l in range(model.cfg.n_layers)]
    kept = {}

    def keep(x, hook):
        x.retain_grad()
        kept[hook.name] = x
    value = logit_diff(model.run_with_hooks(base, fwd_hooks=[(n, keep) for n in names]))
    value.backward()
    donor_acts = model.run_with_cache(donor)[1]
    rows = []
    for n in names:
        prod = (donor_acts[n] - kept[n].detach()) * kept[n].grad  # [batch pos head d_head] | [batch pos d_model]
        rows.append(prod.sum(dim=(0, prod.dim() - 1)))
    return torch.stack(rows) + value.detach()


@pytest.mark.parametrize("what", ["heads", "resid"])
def test_attribution_equals_the_gradient_product_by_hand(gpt, pair, what):
    clean, corrupt = pair
    for direction, base, donor in (("denoise", corrupt, clean), ("noise", clean, corrupt)):
        ours = run(gpt, clean, corrupt, metric=logit_diff, what=what, method="attribution", direction=direction)
        expected = by_hand(gpt, base, donor, what)
        assert_close_to_scale(ours.patched, expected, rel=1e-4)
        assert ours.forwards == 2
    exact = run(gpt, clean, corrupt, metric=logit_diff, what=what)
    assert ours.clean == pytest.approx(exact.clean, rel=1e-5) and ours.corrupt == pytest.approx(exact.corrupt, rel=1e-5)


def saturating_model(strength: float) -> torch.nn.Module:
    """One head, no norm, no MLP output. Token 0 = (1,0,0,0) and 2 = (1,0,1,0) carry the answer's value
    (dim 0), token 1 = (0,1,0,0) the wrong one's (dim 1); token 2 alone has a key (dim 2); token 3 =
    (0,0,0,1) queries it: the score of the last position on token 2 is `strength`, every other 0.
    The logit difference 0 - 1 at the last position is A[last, answer-valued] - A[last, wrong-valued]."""
    model = blank_model(n_heads=1)
    with torch.no_grad():
        model.embedding.weight.copy_(torch.tensor([[1., 0, 0, 0], [0, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 1]]))
        W = model.blocks[0].attention.W_QKV  # [d_model (q k v) x d_head]
        W[3, 0], W[2, 2] = strength, 1.0  # q reads dim 3, k reads dim 2
        W[0, 4], W[1, 5] = 1.0, 1.0  # v: the answer's and the wrong token's value dims
        model.blocks[0].attention.W_O[0, 0] = model.blocks[0].attention.W_O[1, 1] = 1.0
        model.W_out.copy_(torch.eye(4))
    return model


def test_atp_star_fixes_a_saturated_softmax_as_derived_on_paper():
    """clean "1 2 3", corrupt "1 0 3": they differ at position 1 in its key alone. Corrupt: scores 0,
    attention 1/3 each, metric 0. Clean: score s on position 1, metric (e^s - 1) / (e^s + 2).
    Denoising the residual at position 1 is the clean run (exact). AtP: d metric / d score = 1/3 at the
    uniform pattern, times the score's change s. AtP* recomputes the pattern: exact here, since the
    metric is linear in the pattern and the patch moves nothing else."""
    s = 6.0
    model, clean, corrupt = saturating_model(s), torch.tensor([[1, 2, 3]]), torch.tensor([[1, 0, 3]])
    paper_clean = (math.exp(s) - 1) / (math.exp(s) + 2)
    exact = run(model, clean, corrupt, answer=0, wrong=1, what="resid")
    atp = run(model, clean, corrupt, answer=0, wrong=1, what="resid", method="attribution")
    star = run(model, clean, corrupt, answer=0, wrong=1, what="resid", method="attribution", atp_star=True)
    assert exact.clean == pytest.approx(paper_clean, rel=1e-6) and exact.corrupt == pytest.approx(0, abs=1e-7)
    assert_close_to_scale(exact.patched, torch.tensor([[0.0, paper_clean, 0.0]]))
    assert_close_to_scale(atp.patched, torch.tensor([[0.0, s / 3, 0.0]]))
    assert_close_to_scale(star.patched, exact.patched)


def test_atp_star_is_closer_to_exact_on_a_random_gpt(gpt, pair):
    exact = run(gpt, *pair, metric=logit_diff).patched.flatten()
    corr = {star: float(torch.corrcoef(torch.stack([
        run(gpt, *pair, metric=logit_diff, method="attribution", atp_star=star).patched.flatten(), exact]))[0, 1])
        for star in (False, True)}
    assert corr[True] > corr[False] > 0.5


def test_atp_star_needs_pre_norm_blocks(pair):
    post_norm = build_model(TransformerConfig(d_vocab=20, n_ctx=8, d_model=8, n_layers=1, n_heads=2, d_head=4,
                                              d_mlp=8, norm="layer", norm_placement="post")).eval()
    with pytest.raises(ProbeInputError, match="AtP\\*'s QK fix .*pre-norm"):
        run(post_norm, *pair, answer=3, method="attribution", atp_star=True)
    assert run(post_norm, *pair, answer=3, method="attribution").forwards == 2  # plain AtP reads any hook points
