"""Logit lens: last layer == model logits, hand-set toys computed on paper, agreement with
TransformerLens on a TransformerBridge, the pure statistics against their definitions, the
tuned-lens hook, and the CLI (grid, JSON, exit 2 on bad input)."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models import TransformerConfig, build_model, get_preset
from models.checkpoint import save_snapshot
from models.tokenizers import CharTokenizer
from models_kit import build, rand_tokens
from probes import logit_lens
from probes.common import ProbeInputError
from probes.lens.stats import FinalDistribution, layer_stats
from probes.logit_lens import LogitLens

TEXT = "the quick brown fox jumps over the lazy dog, then the dog sleeps."
LN2, LN3 = math.log(2), math.log(3)


VARIANTS = {
    "no-final-norm separate (series)": get_preset("transformer4_rms_small"),
    "final LayerNorm separate": get_preset("tiny_shakespeare_gpt_small"),
    "final LayerNorm tied (GPT-2)": get_preset("gpt2_124m_small"),
    "final RMSNorm tied": get_preset("transformer4_rms_small", final_norm=True, unembed="tied"),
    "no norm tied": get_preset("transformer2_small", unembed="tied"),
}


# ---------------------------------------------------------------- the invariant

@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("include_mid", [False, True])
def test_last_layer_equals_model_logits(name, include_mid):
    cfg = VARIANTS[name]
    model, tokens = build(cfg), rand_tokens(cfg)
    lens = LogitLens(model, include_mid)
    assert lens.labels[0] == "embed" and lens.labels[-1] == f"{cfg.n_layers - 1}_post"
    assert len(lens.labels) == 1 + cfg.n_layers * (2 if include_mid else 1)
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
        decoded = lens.decode(cache[lens.points[-1].hook], len(lens.points) - 1)
    torch.testing.assert_close(decoded, logits, atol=1e-5, rtol=0)

    result = logit_lens.run(model, tokens, k=3, include_mid=include_mid)
    assert result.readout_error <= 1e-5
    assert result.kl_to_final[-1] == pytest.approx(0.0, abs=1e-5)
    top = torch.tensor([[[e["prob"] for e in pos] for pos in seq] for seq in result.top_k()[-1]])
    torch.testing.assert_close(top, logits.softmax(-1).topk(3, dim=-1).values, atol=1e-5, rtol=0)


def test_train_mode_model_is_run_in_eval_and_restored():
    cfg = VARIANTS["final LayerNorm separate"]  # dropout 0.2
    model = build_model(cfg).train()
    result = logit_lens.run(model, rand_tokens(cfg))
    assert model.training and result.readout_error <= 1e-5


# ---------------------------------------------------------------- toys computed on paper

def toy(final_norm: bool) -> torch.nn.Module:
    """1 block, d_model = d_vocab = 4, embedding = identity, attention and MLP weights zero, MLP
    output bias b e_3: resid after embedding = e_t, after the block e_t + b e_3 (b = 1 with the
    final norm, ln2 / ln3 without, so that W_out = ln3 I turns it into a logit of ln2)."""
    cfg = TransformerConfig(d_vocab=4, n_ctx=4, d_model=4, n_layers=1, n_heads=1, d_head=4, d_mlp=4,
                            pos_embed="none", norm="rms" if final_norm else "none",
                            final_norm=final_norm, norm_eps=1e-12)
    model = build_model(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for name, p in model.named_parameters():
            if name.endswith("gamma"):
                p.fill_(1.0)
        model.embedding.weight.copy_(torch.eye(4))
        # no norm: logits = ln3 * resid; RMS final norm: logits = (ln2 / sqrt 2) * resid / rms(resid)
        model.W_out.copy_(torch.eye(4) * (LN2 / math.sqrt(2) if final_norm else LN3))
        model.blocks[0].mlp.net[-1].bias.copy_(torch.tensor([0.0, 0.0, 0.0, 1.0 if final_norm else LN2 / LN3]))
    return model


def test_toy_without_final_norm_gives_paper_probabilities():
    # embed: logits ln3 * e_t -> p = 3/6 on t, 1/6 elsewhere.
    # after the block: ln3 * e_t + ln2 * e_3 -> exp = 3 on t, 2 on token 3, 1 elsewhere: /7.
    result = logit_lens.run(toy(final_norm=False), torch.tensor([[0, 1, 2]]), k=4)
    assert result.layers == ["embed", "0_post"]
    embed, final = result.top_k()
    assert embed[0][0][0]["id"] == 0 and [e["prob"] for e in embed[0][0]] == pytest.approx([3 / 6] + [1 / 6] * 3)
    assert [e["id"] for e in final[0][1][:2]] == [1, 3]
    assert [e["prob"] for e in final[0][1]] == pytest.approx([3 / 7, 2 / 7, 1 / 7, 1 / 7])
    # targets 1 then 2: p = 1/6 (embed), 1/7 (final); rank: ln3 beats 0 (embed); ln3, ln2 (final)
    assert result.cross_entropy == pytest.approx([math.log(6), math.log(7)])
    assert result.per_position("cross_entropy")[1] == [[pytest.approx(math.log(7))] * 2 + [None]]
    assert result.target_rank == [1.0, 2.0]
    assert result.per_position("rank") == [[[1, 1, None]], [[2, 2, None]]]
    # KL(final || embed), every position alike: p = (3, 1, 1, 2)/7, q = (3, 1, 1, 1)/6
    kl = 3 / 7 * math.log((3 / 7) / (3 / 6)) + 2 * (1 / 7) * math.log((1 / 7) / (1 / 6)) \
        + 2 / 7 * math.log((2 / 7) / (1 / 6))
    assert result.kl_to_final == pytest.approx([kl, 0.0], abs=1e-6)
    assert result.per_position("kl")[0][0] == pytest.approx([kl] * 3, abs=1e-6)


def test_toy_final_rmsnorm_is_recomputed_on_each_vector():
    # embed: resid e_t, rms = 1/2 -> normalised 2 e_t -> logits sqrt2 ln2 e_t: p_t = 2^sqrt2 / (2^sqrt2 + 3).
    # (the final layer's cached scale, 1/sqrt2, would give 2/5 instead.)
    # after the block: e_t + e_3, rms = 1/sqrt2 -> logits ln2 on t and 3: p = (2, 2, 1, 1)/6.
    result = logit_lens.run(toy(final_norm=True), torch.tensor([[0, 1, 2]]), k=4)
    embed, final = result.top_k()
    a = 2 ** math.sqrt(2)
    assert embed[0][0][0]["id"] == 0 and embed[0][0][0]["prob"] == pytest.approx(a / (a + 3), abs=1e-6)
    assert sorted(e["id"] for e in final[0][0][:2]) == [0, 3]
    assert [e["prob"] for e in final[0][0]] == pytest.approx([1 / 3, 1 / 3, 1 / 6, 1 / 6], abs=1e-6)
    assert result.cross_entropy == pytest.approx([math.log(a + 3), math.log(6)], abs=1e-6)
    p, q = [2 / 6, 1 / 6, 1 / 6, 2 / 6], [a / (a + 3), 1 / (a + 3), 1 / (a + 3), 1 / (a + 3)]
    assert result.kl_to_final[0] == pytest.approx(sum(pi * math.log(pi / qi) for pi, qi in zip(p, q)), abs=1e-6)


# ---------------------------------------------------------------- TransformerLens agreement

@pytest.fixture(scope="module", params=["LN", "RMS"])
def bridge(request):
    from transformer_lens import TransformerBridge
    return TransformerBridge.boot_native({
        "n_layers": 2, "d_model": 32, "n_heads": 4, "d_head": 8, "d_mlp": 64, "d_vocab": 50,
        "n_ctx": 16, "act_fn": "gelu", "normalization_type": request.param, "seed": 0})


def reference_stats(bridge, tokens: torch.Tensor, k: int):
    """TransformerLens' own logit lens: the accumulated residual stack, its final norm recomputed
    on each entry (`apply_ln_to_stack(recompute_ln=True)`), then W_U + b_U; stats by definition."""
    with torch.no_grad():
        logits, cache = bridge.run_with_cache(tokens)
        stack, labels = cache.accumulated_resid(incl_mid=True, apply_ln=False, return_labels=True)
        lens_logits = cache.apply_ln_to_stack(stack, layer=None, recompute_ln=True) @ bridge.W_U + bridge.b_U
    log_p = lens_logits.log_softmax(-1)  # [layer batch pos vocab]
    final = logits.log_softmax(-1)
    kl = F.kl_div(log_p, final.expand_as(log_p), log_target=True, reduction="none").sum(-1)
    targets = tokens[:, 1:].expand(log_p.shape[0], -1, -1).unsqueeze(-1)
    ce = -log_p[:, :, :-1].gather(-1, targets).squeeze(-1)
    rank = (lens_logits[:, :, :-1] > lens_logits[:, :, :-1].gather(-1, targets)).sum(-1)
    return labels, kl, ce, rank, log_p.exp().topk(k, dim=-1).values


def test_agrees_with_transformer_lens_on_a_bridge(bridge):
    tokens = torch.randint(0, 50, (3, 12), generator=torch.Generator().manual_seed(0))
    labels, kl, ce, rank, top = reference_stats(bridge, tokens, k=5)
    result = logit_lens.run(bridge, tokens, k=5, include_mid=True)
    assert labels == ["0_pre", "0_mid", "1_pre", "1_mid", "final_post"]
    assert result.layers == ["embed", "0_mid", "0_post", "1_mid", "1_post"]
    assert result.readout_error <= 1e-5
    torch.testing.assert_close(torch.tensor(result.per_position("kl")), kl, atol=2e-5, rtol=1e-4)
    ours_ce = torch.tensor([[row[:-1] for row in layer] for layer in result.per_position("cross_entropy")])
    torch.testing.assert_close(ours_ce, ce, atol=2e-5, rtol=1e-5)
    assert [[row[:-1] for row in layer] for layer in result.per_position("rank")] == rank.tolist()
    ours_top = torch.tensor([[[[e["prob"] for e in pos] for pos in seq] for seq in layer] for layer in result.top_k()])
    torch.testing.assert_close(ours_top, top, atol=1e-5, rtol=1e-5)
    assert result.cross_entropy == pytest.approx(ce.mean(dim=(1, 2)).tolist(), abs=1e-5)


# ---------------------------------------------------------------- pure statistics

@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 3), st.integers(1, 6), st.integers(2, 40), st.integers(1, 5), st.integers(0, 2**16))
def test_layer_stats_match_their_definitions(batch, pos, vocab, k, seed):
    gen = torch.Generator().manual_seed(seed)
    layer = torch.randn(batch, pos, vocab, generator=gen) * 3
    final = torch.randn(batch, pos, vocab, generator=gen) * 3
    tokens = torch.randint(0, vocab, (batch, pos), generator=gen)
    s = layer_stats(layer, FinalDistribution.from_logits(final), tokens, k)
    log_q, log_p = layer.log_softmax(-1), final.log_softmax(-1)
    torch.testing.assert_close(s.kl, (log_p.exp() * (log_p - log_q)).sum(-1), atol=1e-5, rtol=1e-4)
    assert (s.kl >= 0).all()
    torch.testing.assert_close(s.cross_entropy, F.cross_entropy(
        layer[:, :-1].reshape(-1, vocab), tokens[:, 1:].reshape(-1), reduction="none").view(batch, pos - 1))
    expected_rank = [[sum(v > row[t] for v in row) for row, t in zip(rows, ts)]
                     for rows, ts in zip(layer[:, :-1].tolist(), tokens[:, 1:].tolist())]
    assert s.rank.tolist() == expected_rank
    torch.testing.assert_close(s.top_probs, log_q.exp().topk(min(k, vocab), dim=-1).values)


class ZeroTranslatorLens(LogitLens):
    """A tuned-lens stand-in: a 'translator' that maps every residual to zero before decoding."""

    def decode(self, resid, layer_index):
        return super().decode(torch.zeros_like(resid), layer_index)


def test_a_subclass_overrides_decode_only():
    cfg = VARIANTS["no-final-norm separate (series)"]
    model = build(cfg)
    result = logit_lens.run(model, rand_tokens(cfg), lens=ZeroTranslatorLens(model))
    # zero logits -> uniform: CE = ln V at every layer, and the last layer no longer reads out
    assert result.cross_entropy == pytest.approx([math.log(cfg.d_vocab)] * len(result.layers), abs=1e-5)
    assert result.readout_error > 1e-3


def test_long_rows_are_windowed_to_the_context():
    cfg = VARIANTS["no-final-norm separate (series)"]
    n = 2 * cfg.n_ctx + cfg.n_ctx // 2
    result = logit_lens.run(build(cfg), torch.arange(n).remainder(cfg.d_vocab)[None], batch_size=2)
    assert [len(row) for row in result.tokens] == [cfg.n_ctx, cfg.n_ctx, cfg.n_ctx // 2]


# ---------------------------------------------------------------- refusals and the CLI

@pytest.mark.parametrize("preset, message", [("char_mlp_small", "no residual stream"),
                                             ("attn1_noscale_small", "no unembedding")])
def test_models_the_lens_cannot_read_are_refused(preset, message):
    with pytest.raises(ProbeInputError, match=message):
        logit_lens.run(build_model(get_preset(preset)), torch.zeros(1, 8, dtype=torch.long))


@pytest.fixture
def snapshot(tmp_path):
    def make(preset: str = "tiny_shakespeare_gpt_small", **overrides):
        tok = CharTokenizer.from_text(TEXT)
        model = build(get_preset(preset, d_vocab=tok.vocab_size, **overrides))
        return str(save_snapshot(tmp_path / preset, model, tok))
    return make


def test_cli_prints_a_layer_by_position_grid(snapshot, capsys):
    assert logit_lens.main(["--ckpt", snapshot(), "--text", "the dog sleeps", "-k", "3"]) == 0
    out = capsys.readouterr().out
    assert "KL(final||layer)" in out and "sequence 0, positions 0..7" in out
    assert "input   't'" in out and "next    'h'" in out
    assert all(label in out for label in ("embed", "0_post", "1_post")) and "top-3 at the last position" in out


def test_cli_json(snapshot, capsys):
    assert logit_lens.main(["--ckpt", snapshot(), "--text", "the dog", "--json", "--mid"]) == 0
    data = json.loads(capsys.readouterr().out)
    n_layers = get_preset("tiny_shakespeare_gpt_small").n_layers
    assert data["layers"] == ["embed"] + [f"{l}_{where}" for l in range(n_layers) for where in ("mid", "post")]
    for key in ("kl_to_final", "cross_entropy", "target_rank"):
        assert len(data[key]) == 1 + 2 * n_layers and len(data[key + "_per_position"][0][0]) == 7
    assert data["cross_entropy_per_position"][0][0][-1] is None
    assert data["target_rank_per_position"][0][0][-1] is None
    assert data["pieces"] == [list("the dog")]
    assert set(data["top_k"][0][0][0][0]) == {"id", "piece", "prob"} and len(data["top_k"][0][0][0]) == 5


@pytest.mark.parametrize("preset, args, message", [
    ("tiny_shakespeare_gpt_small", ["--text", ""], "the text is empty"),
    ("tiny_shakespeare_gpt_small", ["--text", "XYZ"], "not in the vocabulary"),
    ("attn1_noscale_small", ["--text", "the dog"], "no unembedding"),
    ("char_mlp_small", ["--text", "the dog sleeps"], "no residual stream"),
])
def test_cli_bad_input_is_one_line_and_exit_2(snapshot, capsys, preset, args, message):
    assert logit_lens.main(["--ckpt", snapshot(preset), *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: ") and message in captured.err
    assert captured.err.count("\n") == 1


@pytest.mark.parametrize("text, warned", [("t", True), ("th", False)])
def test_cli_says_that_one_token_has_no_next_token(snapshot, capsys, text, warned):
    assert logit_lens.main(["--ckpt", snapshot(), "--text", text]) == 0
    err = capsys.readouterr().err
    assert ("warning: the text is one token, which has no next token" in err) == warned, err
    assert err.count("\n") == int(warned)
