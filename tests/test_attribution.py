"""probes.attribution: the rows sum to the logit, equal TransformerLens's `logit_attrs`, predict
ablations where the later layers are linear, run on a TransformerBridge; bad input and the CLI.

Reference: TransformerLens 4.3 has no HookedTransformer. A HookedTransformer folds the final
norm's gamma into W_U (and beta into b_U); our models keep them in the norm. So the reference is
`ActivationCache.logit_attrs` on the cache of a *folded twin* of our model (gamma * W_U, b_U + beta
W_U, gamma = 1, beta = 0: the same logits), over the stack [embed, pos_embed, each head's result
(`stack_head_results`), each MLP's output, the summed b_O].
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from test_activation_cache import randomise_norms_and_biases
from llama_kit import llama, llama_tokens, tl_folded_twin  # noqa: F401  (fixture: a Llama-family bridge)
from test_interop import BRIDGE_CFG, bridge  # noqa: F401  (fixture: a TransformerBridge)

from models import TransformerConfig, build_model, get_preset
from models.checkpoint import load_checkpoint
from probes import attribution
from probes.common import ProbeInputError


def random_model(norm: str = "layer", **overrides) -> torch.nn.Module:
    cfg = get_preset("tiny_shakespeare_gpt_small", d_vocab=40, n_layers=3, n_ctx=16, norm=norm, **overrides)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    randomise_norms_and_biases(model)
    with torch.no_grad():
        model.W_out.mul_(20.0)  # logits of order 1, so agreement to 1e-5 is not trivially small numbers
    return model


def folded_twin(model: torch.nn.Module) -> torch.nn.Module:
    twin = copy.deepcopy(model)
    ln = twin.ln_final
    with torch.no_grad():
        twin.b_out.add_(ln.beta @ twin.W_out) if hasattr(ln, "beta") else None
        twin.W_out.mul_(ln.gamma.unsqueeze(1))
        ln.gamma.fill_(1.0)
        if hasattr(ln, "beta"):
            ln.beta.zero_()
    return twin


TOKENS = torch.randint(0, 40, (1, 12), generator=torch.Generator().manual_seed(7))


@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_rows_equal_logit_attrs_on_a_folded_twin(norm):
    model = random_model(norm, unembed_bias=True, attn_out_bias=True)
    twin = folded_twin(model)
    with torch.no_grad():
        logits, cache = twin.run_with_cache(TOKENS)
        torch.testing.assert_close(logits, model(TOKENS), atol=1e-5, rtol=1e-5)  # the twins are one model
    heads = cache.stack_head_results(layer=-1)  # [layer*head batch pos d_model]
    mlps = torch.stack([cache["mlp_out", l] for l in range(3)])
    bias = cache.model.b_O.sum(0).expand_as(cache["embed"]).unsqueeze(0)
    stack = torch.cat([cache["embed"].unsqueeze(0), cache["pos_embed"].unsqueeze(0), heads, mlps, bias])
    for pos, target, versus in [(4, 3, None), (11, 17, 5), (0, 39, None)]:
        ours = attribution.run(model, TOKENS, position=pos, target=target, versus=versus)
        ref = cache.logit_attrs(stack, target, versus)[:, 0, pos]  # [rows]
        assert ours.labels[:-1] == ["embed", "pos_embed"] + [f"L{l}H{h}" for l in range(3) for h in range(4)] + \
            [f"L{l} MLP" for l in range(3)] + ["attn_bias"]
        torch.testing.assert_close(torch.tensor(ours.values[:-1]), ref, atol=1e-5, rtol=0)
        assert abs(ours.total - ours.logit) < 1e-4
        assert abs(ours.total - ours.values[-1] - float(ref.sum())) < 1e-4
        assert max(abs(v) for v in ours.values) > 0.1


@pytest.mark.parametrize("ckpt", ["shakespeare_gpt", "shakespeare_rms4", "mha4"])
def test_rows_sum_to_the_models_logit_on_shipped_runs(ckpt):
    snap = load_checkpoint(f"checkpoints/{ckpt}")
    ids = snap.tokenizer.encode("ROMEO: But soft, what light")
    with torch.no_grad():
        logits = snap.model(torch.tensor([ids]))[0]
    for pos in (0, 7, -1):
        r = attribution.run(snap.model, torch.tensor([ids]), position=pos)
        expected = ids[pos + 1] if pos != -1 else int(logits[-1].argmax())
        assert r.target["id"] == expected and r.target["source"] == ("top" if pos == -1 else "next")
        assert abs(r.logit - float(logits[pos, expected])) < 1e-4
        assert abs(r.total - r.logit) < 1e-4, (ckpt, pos, r.total, r.logit)
    diff = attribution.run(snap.model, torch.tensor([ids]), position=3, target="e", versus=" ")
    e, space = snap.tokenizer.encode("e")[0], snap.tokenizer.encode(" ")[0]
    assert abs(diff.total - float(logits[3, e] - logits[3, space])) < 1e-4


def test_runs_on_a_transformer_bridge(bridge):  # noqa: F811
    tokens = torch.randint(0, BRIDGE_CFG["d_vocab"], (1, 10), generator=torch.Generator().manual_seed(1))
    r = attribution.run(bridge, tokens, position=5)
    with torch.no_grad():
        logit = float(bridge(tokens)[0, 5, int(tokens[0, 6])])
    assert r.target["id"] == int(tokens[0, 6]) and abs(r.logit - logit) < 1e-5
    assert abs(r.total - r.logit) < 1e-4
    assert len(r.heads) == BRIDGE_CFG["n_layers"] and len(r.heads[0]) == BRIDGE_CFG["n_heads"]


def test_a_bias_free_rmsnorm_gated_mlp_bridge_equals_transformer_lens(llama):  # noqa: F811
    """Llama-family: no biases (b_O is None), RMSNorm with random gains, SwiGLU, rotary, GQA. The
    rows sum to the logit and equal TransformerLens's own `logit_attrs` on its folded twin."""
    twin, tokens = tl_folded_twin(), llama_tokens()
    with torch.no_grad():
        logits, cache = twin.run_with_cache(tokens)
        torch.testing.assert_close(logits, llama(tokens), atol=1e-5 * float(logits.abs().max()), rtol=0)
    stack = torch.cat([cache["embed"].unsqueeze(0), cache.stack_head_results(layer=-1),
                       torch.stack([cache["mlp_out", l] for l in range(2)])])  # [rows batch pos d_model]
    for pos, target, versus in [(5, 17, None), (11, 3, 40), (0, 49, None)]:
        ours = attribution.run(llama, tokens, position=pos, target=target, versus=versus)
        ref = cache.logit_attrs(stack, target, versus)[:, 0, pos]  # [rows]
        assert ours.labels == ["embed"] + [f"L{l}H{h}" for l in range(2) for h in range(4)] + \
            ["L0 MLP", "L1 MLP", "attn_bias", "final_bias"]
        scale = float(ref.abs().max())
        assert scale > 0.1
        torch.testing.assert_close(torch.tensor(ours.values[:-2]), ref, atol=1e-5 * scale, rtol=0)
        assert ours.values[-2:] == [0.0, 0.0]  # no b_O, no final shift, no b_U
        expected = float(logits[0, pos, target] - (0 if versus is None else logits[0, pos, versus]))
        assert ours.total == pytest.approx(expected, rel=1e-5, abs=1e-5 * scale)
        assert ours.logit == pytest.approx(expected, rel=1e-5, abs=1e-5 * scale)


# ---------------------------------------------------------------- ablation where the rest is linear

def attention_only(n_layers: int) -> torch.nn.Module:
    """No norms, zeroed MLPs: after a head, the residual reaches the logits linearly unless a later
    head reads it (its V, or its pattern through Q and K)."""
    cfg = TransformerConfig(d_vocab=30, n_ctx=12, d_model=24, n_layers=n_layers, n_heads=3, d_head=8,
                            d_mlp=8, norm="none", attn_scale="sqrt_d_head", attn_out_bias=True)
    torch.manual_seed(3)
    model = build_model(cfg).eval()
    with torch.no_grad():
        for block in model.blocks:
            for p in block.mlp.parameters():
                p.zero_()
        model.W_out.mul_(5.0)
    return model


def ablated_logit(model, tokens, layer: int, head: int, pos: int, target: int) -> float:
    def zero(z, hook):  # [batch pos head d_head]
        z = z.clone()
        z[:, pos, head] = 0
        return z
    with torch.no_grad():
        return float(model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", zero)])[0, pos, target])


def test_zeroing_a_head_changes_the_logit_by_its_attribution():
    tokens = torch.randint(0, 30, (1, 12), generator=torch.Generator().manual_seed(2))
    model = attention_only(2)
    with torch.no_grad():
        model.blocks[1].attention.W_QKV[:, 2 * 24:].zero_()  # layer 1 reads no values: linear after layer 0
    for pos, target in [(5, 4), (11, 20)]:
        r = attribution.run(model, tokens, position=pos, target=target)
        for layer in (0, 1):
            for head in range(3):
                change = ablated_logit(model, tokens, layer, head, pos, target) - r.logit
                assert abs(change + r.heads[layer][head]) < 1e-5, (layer, head, change, r.heads[layer][head])
        assert max(abs(v) for v in r.heads[0]) > 0.05


def test_a_head_read_by_a_later_layer_is_more_than_its_direct_effect():
    """The converse, so the test above can fail: with layer 1 reading values, ablating a layer-0
    head also changes what layer 1 writes."""
    tokens = torch.randint(0, 30, (1, 12), generator=torch.Generator().manual_seed(2))
    model = attention_only(2)
    r = attribution.run(model, tokens, position=11, target=20)
    gaps = [abs(ablated_logit(model, tokens, 0, h, 11, 20) - r.logit + r.heads[0][h]) for h in range(3)]
    assert max(gaps) > 1e-3


# ---------------------------------------------------------------- bad input and the CLI

def test_bad_input_is_one_line():
    model = random_model()
    for kwargs, match in [(dict(target=40), "outside the vocabulary"), (dict(position=12), "beyond"),
                          (dict(position=-13), "beyond"), (dict(versus=-1), "outside the vocabulary"),
                          (dict(target="e"), "no tokenizer")]:
        with pytest.raises(ProbeInputError, match=match) as info:
            attribution.run(model, TOKENS, **kwargs)
        assert "\n" not in str(info.value)
    with pytest.raises(ProbeInputError, match="context"):
        attribution.run(model, torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ProbeInputError, match="no attention"):
        attribution.run(build_model(get_preset("char_mlp_small")), torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ProbeInputError, match="residual"):
        attribution.run(build_model(get_preset("tiny_shakespeare_gpt_small", residual=False)), TOKENS[:, :4])


def test_cli(capsys):
    gpt = ["--ckpt", "checkpoints/shakespeare_gpt"]
    assert attribution.main(gpt + ["--text", "ROMEO:", "--position", "-1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert abs(sum(out["values"]) - out["logit"]) < 1e-4 and out["target"]["source"] == "top"
    assert len(out["heads"]) == 4 and len(out["heads"][0]) == 6 and len(out["mlps"]) == 4
    assert attribution.main(gpt + ["--text", "ROMEO:", "--target", "e", "--versus", "a"]) == 0
    assert "minus 'a'" in capsys.readouterr().out
    for argv, match in [(["--text", "ROMEO:", "--target", "é"], "not in the vocabulary"),
                        (["--text", "ROMEO:", "--position", "6"], "beyond"),
                        (["--text", "x" * 65], "context of 64")]:
        assert attribution.main(gpt + argv) == 2
        err = capsys.readouterr().err.strip()
        assert match in err and "\n" not in err
    assert attribution.main(["--ckpt", "checkpoints/char_mlp", "--text", "ROMEO"]) == 2
    assert "no attention" in capsys.readouterr().err
