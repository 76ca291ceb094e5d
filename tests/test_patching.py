"""probes.patching (exact) and probes.ablate: agreement with TransformerLens's own patching
functions on our models (every `what`, both directions, by position or not, through the replay
and through hook points), a hand-set model whose patching answer is derived on paper, and head
ablation against zeroed slices written by hand.

Reference: TransformerLens 4.3's `transformer_lens.patching` loops one forward per patch on any
model with `run_with_hooks` and a `cfg` holding n_layers, n_heads, n_key_value_heads and `device`
(ours lacks `device`, so it runs through `TLShim`)."""

from __future__ import annotations

import types

import pytest
import torch
from close import assert_close_to_scale
from transformer_lens import patching as tlp

from models import TransformerConfig, build_model, get_preset
from probes import ablate
from probes.common import ProbeInputError
from probes.patching import run

VOCAB = 20


class TLShim:
    """What transformer_lens.patching reads from a model besides run_with_hooks."""

    def __init__(self, model):
        self.model = model
        self.cfg = types.SimpleNamespace(device="cpu", n_layers=model.cfg.n_layers, n_heads=model.cfg.n_heads,
                                         n_key_value_heads=None)

    def run_with_hooks(self, *args, **kwargs):
        return self.model.run_with_hooks(*args, **kwargs)


@pytest.fixture(scope="module")
def gpt():
    """A 2-layer GPT (LayerNorm, learned positions) with random weights, q/k sharpened so that the
    patterns are far from uniform and patches move the metric by different amounts."""
    cfg = get_preset("tiny_shakespeare_gpt_small", d_vocab=VOCAB, n_layers=2, n_ctx=16)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.attention.W_QKV.mul_(10.0)
        model.W_out.mul_(20.0)
    return model


@pytest.fixture(scope="module")
def pair():
    gen = torch.Generator().manual_seed(1)
    clean = torch.randint(0, VOCAB, (2, 7), generator=gen)
    corrupt = clean.clone()
    corrupt[:, 2] = (corrupt[:, 2] + 3) % VOCAB
    return clean, corrupt


def logit_diff(logits):  # [batch pos vocab] -> []
    return (logits[:, -1, 3] - logits[:, -1, 5]).mean()


def whole(x, index, donor):  # TransformerLens patch setter: the layer's activation at every position
    x[:] = donor
    return x


TL_SWEEPS = {  # (what, by_position) -> TransformerLens's function on (model, tokens, cache, metric)
    ("heads", True): tlp.get_act_patch_attn_head_out_by_pos,
    ("heads", False): tlp.get_act_patch_attn_head_out_all_pos,
    ("resid", True): tlp.get_act_patch_resid_pre,
    ("attn", True): tlp.get_act_patch_attn_out,
    ("mlp", True): tlp.get_act_patch_mlp_out,
    **{(what, False): lambda m, t, c, f, name=name: tlp.generic_activation_patch(
        m, t, c, f, whole, name, index_axis_names=["layer"])
       for what, name in (("resid", "resid_pre"), ("attn", "attn_out"), ("mlp", "mlp_out"))},
}


@pytest.fixture(scope="module")
def tl_sweeps(gpt, pair):
    """TransformerLens's answer for every (what, by_position, direction)."""
    caches = [gpt.run_with_cache(tokens)[1] for tokens in pair]  # clean, corrupt
    return {(what, by_position, direction): sweep(TLShim(gpt), pair[direction == "denoise"],
                                                  caches[direction == "noise"], logit_diff)
            for (what, by_position), sweep in TL_SWEEPS.items() for direction in ("denoise", "noise")}


@pytest.mark.parametrize("engine", ["replay", "hooked"])
def test_exact_patching_equals_transformer_lens(gpt, pair, tl_sweeps, engine, monkeypatch):
    if engine == "hooked":  # our model through its hook points, as a bridge is patched
        monkeypatch.setattr("probes.patching.engines.is_ours", lambda model: False)
    clean, corrupt = pair
    for (what, by_position) in TL_SWEEPS:
        for direction in ("denoise", "noise"):
            ref = tl_sweeps[what, by_position, direction]
            for kwargs in (dict(answer=3, wrong=5), dict(metric=logit_diff)):
                ours = run(gpt, clean, corrupt, what=what, by_position=by_position, direction=direction,
                           batch=3, **kwargs)
                assert ours.patched.shape == ref.shape, (what, by_position)
                assert_close_to_scale(ours.patched, ref, rel=1e-4)
            if (what, by_position) != ("resid", False):  # the whole residual stream is the clean run at any layer
                assert float(ref.max() - ref.min()) > 1e-2 * float(ref.abs().max())  # patches differ: a real test
    assert ours.forwards == 2 + gpt.cfg.n_layers  # one batch of 1 patch per layer: all positions at once


def test_the_batch_size_does_not_change_the_answer(gpt, pair):
    one = run(gpt, *pair, answer=3, wrong=5, batch=1)
    many = run(gpt, *pair, answer=3, wrong=5)
    assert_close_to_scale(many.patched, one.patched, rel=1e-5)
    n_layers, n_pos, n_heads = one.patched.shape
    # one forward per patch, but for the last block's heads before the last position (they reach nothing)
    assert one.forwards == 2 + one.patched.numel() - (n_pos - 1) * n_heads and many.forwards < one.forwards


def blank_model(n_heads: int) -> torch.nn.Module:
    """One layer over 4 tokens and 4 dims, no norm, no positions, no scaling, every weight 0: the
    hand-set models set what they need."""
    cfg = TransformerConfig(d_vocab=4, n_ctx=8, d_model=4, n_layers=1, n_heads=n_heads, d_head=2, d_mlp=4,
                            attn_scale="none", pos_embed="none")
    model = build_model(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    return model


def hand_model() -> torch.nn.Module:
    """One layer, two heads reading one-hot embeddings: q = k = 0 (each position attends uniformly
    to itself and all before it), head 0's v is the embedding's dims 0-1, head 1's dims 2-3, W_O
    and the unembedding are identities, the MLP writes nothing. So the last position's logits are
    its own one-hot plus the mean one-hot of the whole prefix."""
    model = blank_model(n_heads=2)
    with torch.no_grad():
        model.embedding.weight.copy_(torch.eye(4))
        model.blocks[0].attention.W_QKV[:, 8:12] = torch.eye(4)  # [d_model (q k v) x (head d_head)]: v only
        model.blocks[0].attention.W_O.copy_(torch.eye(4))
        model.W_out.copy_(torch.eye(4))
    return model


def test_hand_set_model_patches_as_derived_on_paper():
    """clean "0 2 3", corrupt "1 2 3", metric logit[0] - logit[1] at the last position: the mean
    one-hot gives +1/3 clean and -1/3 corrupt. Denoising, only head 0's z at the last position
    carries the difference to the last position (+1/3, normalised 1); head 1 reads dims 2-3, equal
    in both runs (-1/3). The residual stream differs only at position 0, which the last position
    reads through attention: patching it there gives the clean +1/3."""
    model, clean, corrupt = hand_model(), torch.tensor([[0, 2, 3]]), torch.tensor([[1, 2, 3]])
    third = 1 / 3
    heads = run(model, clean, corrupt, answer=0, wrong=1)
    assert heads.clean == pytest.approx(third, rel=1e-6) and heads.corrupt == pytest.approx(-third, rel=1e-6)
    expected = torch.full((1, 3, 2), -third)
    expected[0, 2, 0] = third
    assert_close_to_scale(heads.patched, expected)
    resid = run(model, clean, corrupt, answer=0, wrong=1, what="resid")
    assert_close_to_scale(resid.normalised, torch.tensor([[1.0, 0.0, 0.0]]))
    noised = run(model, clean, corrupt, answer=0, wrong=1, direction="noise")
    assert_close_to_scale(noised.patched, -expected)


def test_top_predictions_of_one_cell_are_the_patched_runs(gpt, pair):
    result = run(gpt, *pair, answer=3, wrong=5, method="exact")
    top = result.top_predictions((1, 6, 2), k=3)
    z = gpt.run_with_cache(pair[0])[1]["blocks.1.attn.hook_z"]

    def patch(x, hook):
        x[:, 6, 2] = z[:, 6, 2]
        return x
    with torch.no_grad():
        logits = gpt.run_with_hooks(pair[1], fwd_hooks=[("blocks.1.attn.hook_z", patch)])[0, -1]
    probs = logits.softmax(-1)
    assert [t["id"] for t in top] == probs.topk(3).indices.tolist()
    assert top[0]["prob"] == pytest.approx(float(probs.max()), rel=1e-4)


@pytest.mark.parametrize("bad, words", [
    (dict(clean=[[1, 2, 3]], corrupt=[[1, 2]]), "differ in shape"),
    (dict(answer=VOCAB), "outside the vocabulary"),
    (dict(answer=3, wrong=3), "same token"),
    (dict(answer=None), "give an answer"),
    (dict(what="neurons"), "what must be one of"),
    (dict(batch=0), "batch must be"),
])
def test_bad_input_is_one_line(gpt, bad, words):
    kwargs = dict(clean=[[1, 2, 3]], corrupt=[[1, 4, 3]], answer=3) | bad
    with pytest.raises(ProbeInputError, match=words):
        run(gpt, **kwargs)


def test_ablation_equals_zeroed_and_mean_slices_by_hand(gpt, pair):
    tokens, heads = pair[0], [(0, 1), (1, 2)]
    for how in ("zero", "mean"):
        result = ablate.run(gpt, tokens, heads=heads, how=how)
        means = {l: gpt.run_with_cache(tokens)[1][f"blocks.{l}.attn.hook_z"].mean(dim=(0, 1)) for l in (0, 1)}

        def loss_with(chosen):
            def hook(z, hook):
                layer = int(hook.name.split(".")[1])
                for l, h in chosen:
                    if l == layer:
                        z[:, :, h] = means[l][h] if how == "mean" else 0.0
                return z
            with torch.no_grad():
                logits = gpt.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{l}.attn.hook_z", hook) for l in (0, 1)])
            return ablate.token_losses(logits, tokens)  # [batch pos-1]
        none = loss_with([])
        assert result.loss == pytest.approx(float(none.mean()), rel=1e-5)
        for h in heads:
            assert result.each[h] == pytest.approx(float(loss_with([h]).mean()), rel=1e-5)
        both = loss_with(heads)
        assert result.together == pytest.approx(float(both.mean()), rel=1e-5)
        assert_close_to_scale(result.per_token, both - none)
        assert abs(result.together - result.loss) > 1e-3  # the heads matter: the comparison means something


def test_a_bridge_patches_as_transformer_lens_does(pair):
    """A TransformerBridge has TransformerLens's own cfg (device included): its functions run on it as is."""
    from test_interop import BRIDGE_CFG
    from transformer_lens import TransformerBridge
    bridge = TransformerBridge.boot_native(dict(BRIDGE_CFG)).eval()
    clean, corrupt = pair
    with torch.no_grad():
        ref = tlp.get_act_patch_attn_head_out_by_pos(bridge, corrupt, bridge.run_with_cache(clean)[1], logit_diff)
    assert_close_to_scale(run(bridge, clean, corrupt, metric=logit_diff).patched, ref, rel=1e-4)
    assert float(ref.std()) > 1e-3 * float(ref.abs().max())


@pytest.mark.parametrize("switches", [dict(qk_norm="rms"), dict(norm="rms"), dict(attn_bias=True),
                                      dict(norm="layer", norm_placement="post", final_norm=False)])
def test_the_replay_equals_the_hook_points_on_other_blocks(pair, switches, monkeypatch, caplog):
    """The replay of our blocks (q/k norm, RMSNorm, biases, post-norm) against whole forwards through
    the model's hook points, every what."""
    cfg = get_preset("tiny_shakespeare_gpt_small", d_vocab=VOCAB, n_layers=2, n_ctx=16).replace(**switches)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    replayed = {what: run(model, *pair, answer=3, wrong=5, what=what).patched for what in ("heads", "resid", "mlp")}
    assert "does not reproduce" not in caplog.text  # the replay ran: it matched the model's own logits
    monkeypatch.setattr("probes.patching.engines.is_ours", lambda model: False)
    for what, patched in replayed.items():
        assert_close_to_scale(patched, run(model, *pair, answer=3, wrong=5, what=what).patched, rel=1e-4)
