"""probes.entropy: hand-set toy models with answers derived on paper, agreement with a full
run_with_cache pattern (ours and a TransformerBridge), and the CLI's bad-input contract."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from models import Transformer, TransformerConfig, build_model, get_preset
from probes import entropy
from probes.common import ProbeInputError
from probes.rows import stats as rows_stats

T = 8  # toy context: positional embeddings are the T one-hot rows, so d_model = T


def toy_model(n_layers: int = 1, n_heads: int = 2) -> Transformer:
    """Every weight zero except W_pos = sqrt(30) * I: the residual at position i is sqrt(30) e_i
    in every layer (W_O and the MLPs add 0), and a head with W_Q = W_K = 0 scores every key 0."""
    cfg = TransformerConfig(d_vocab=5, n_ctx=T, d_model=T, n_layers=n_layers, n_heads=n_heads,
                            d_head=T, d_mlp=4, norm="none", attn_scale="none", residual=True)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.W_pos.copy_(math.sqrt(30.0) * torch.eye(T))
    return model


def set_self_head(model: Transformer, layer: int, head: int) -> None:
    """W_Q = W_K = I: q_i . k_j = 30 [i == j], so p_ii = e^30 / (e^30 + i), one-hot to 1e-12."""
    with torch.no_grad():
        h = model.blocks[layer].attention.heads[head]
        h.W_Q.copy_(torch.eye(T))
        h.W_K.copy_(torch.eye(T))


def assert_grid(actual, expected, atol: float = 1e-6) -> None:
    """Nested lists (or tensors) equal elementwise within atol, NaN only where NaN is expected."""
    a = torch.as_tensor(actual, dtype=torch.float64)
    b = torch.as_tensor(expected, dtype=torch.float64)
    assert a.shape == b.shape and torch.allclose(a, b, atol=atol, rtol=0, equal_nan=True), (actual, expected)


def tokens(batch: int = 3, pos: int = T) -> torch.Tensor:
    return torch.randint(0, 5, (batch, pos), generator=torch.Generator().manual_seed(0))


# ---------------------------------------------------------------- pure functions

def test_uniform_rows_have_entropy_ln_k_exactly():
    pattern = torch.ones(T, T).tril()
    pattern = (pattern / pattern.sum(-1, keepdim=True)).double()[None, None]  # [1 1 T T]
    rows = entropy.attention_entropy(pattern)[0, 0]
    expected = torch.log(torch.arange(1, T + 1, dtype=torch.float64))
    assert torch.allclose(rows, expected, atol=1e-8)
    assert torch.allclose(entropy.normalized_entropy(pattern), torch.ones(1, 1, T - 1, dtype=torch.float64))
    assert entropy.series_entropy(pattern).item() == pytest.approx(math.lgamma(T + 1) / T, abs=1e-8)
    assert entropy.uniform_series_entropy(T) == pytest.approx(sum(math.log(i + 1) for i in range(T)) / T)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 7), st.floats(0.0, 30.0), st.integers(0, 2**16))
def test_stats_match_direct_formulas(batch, heads, n, scale, seed):
    """Any causal softmax pattern: the in-hook sums give the series mean, and 0 <= H_i <= ln k_i."""
    g = torch.Generator().manual_seed(seed)
    scores = scale * torch.randn(batch, heads, n, n, generator=g)
    pattern = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf).softmax(-1)
    stats = entropy.PatternStats([0], heads, n)
    stats.update(0, pattern)
    stats.add_batch(batch, n)
    p64 = pattern.double()
    assert torch.allclose(stats.mean("entropy")[0], entropy.series_entropy(p64), atol=1e-6)
    rows = entropy.attention_entropy(p64)
    assert bool((rows >= -1e-6).all()) and bool((rows <= entropy.log_keys(n) + 1e-6).all())
    if n > 1:
        norm = entropy.normalized_entropy(p64).mean(dim=(0, 2))
        assert torch.allclose(stats.mean("normalized")[0], norm, atol=1e-6)
        max_prob = p64[:, :, 1:].amax(-1).mean(dim=(0, 2))
        assert torch.allclose(stats.mean("max_prob")[0], max_prob, atol=1e-6)


def test_chunked_reduction_equals_one_shot(monkeypatch):
    pattern = torch.randn(5, 3, 6, 6).masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), -math.inf).softmax(-1)
    whole = entropy.PatternStats([0], 3, 6)
    whole.update(0, pattern)
    monkeypatch.setattr(rows_stats, "CHUNK_ELEMENTS", 3 * 6 * 6 * 2)  # two windows per chunk
    chunked = entropy.PatternStats([0], 3, 6)
    chunked.update(0, pattern)
    for name in entropy.SUMS:
        assert torch.allclose(whole.sums[0][name], chunked.sums[0][name], atol=1e-9), name


# ---------------------------------------------------------------- the runner on toy models

def test_zero_qk_gives_uniform_rows_ln_i_plus_1():
    model = toy_model(n_layers=2, n_heads=2)  # W_Q = W_K = 0 everywhere
    result = entropy.run(model, tokens(), per_position=True)
    expected_mean = math.lgamma(T + 1) / T  # (1/T) sum_i ln(i+1) = ln(8!)/8 = 1.32558
    assert_grid(result.entropy, [[expected_mean] * 2] * 2)
    assert_grid(result.entropy_normalized, [[1.0] * 2] * 2)
    profile = [math.log(i + 1) for i in range(T)]
    for layer in result.per_position:
        for head in layer:
            assert_grid(head, profile)
    assert (result.tokens, result.windows) == (3 * T, 3)


def test_one_hot_head_has_entropy_near_zero():
    model = toy_model(n_heads=2)
    set_self_head(model, 0, 1)
    result = entropy.run(model, tokens())
    assert_grid(result.entropy[0][1], 0.0)
    assert_grid(result.entropy_normalized[0][1], 0.0)
    assert_grid(result.entropy[0][0], math.lgamma(T + 1) / T)


def test_long_input_is_windowed_and_layer_head_restrict():
    model = toy_model(n_layers=2, n_heads=2)
    result = entropy.run(model, tokens(batch=2, pos=2 * T + 3), layer=1, head=0, per_position=True)
    assert (result.layers, result.heads, result.windows, result.tokens) == ([1], [0], 6, 2 * (2 * T + 3))
    # 4 windows of 8 and 2 of 3: the mean over all rows weights each row once
    expected = (4 * math.lgamma(T + 1) + 2 * math.lgamma(4)) / (4 * T + 2 * 3)
    assert_grid(result.entropy, [[expected]])
    assert_grid(result.per_position[0][0], [math.log(i + 1) for i in range(T)])


def test_series_display_shape():
    result = entropy.EntropyResult("m", [0, 1], [0, 1, 2, 3], [[0.6901, 0.1583, 1.0114, 0.8612], [1.0, 2.0, 3.0, 4.0]],
                                   [[0.5] * 4] * 2, tokens=10, windows=1)
    assert result.series_display() == "{0: [0.69, 0.158, 1.011, 0.861], 1: [1.0, 2.0, 3.0, 4.0]}"
    assert set(result.to_dict()) >= {"entropy", "entropy_normalized", "model", "tokens", "windows"}


def test_hooks_are_removed_even_when_the_reduction_fails(monkeypatch):
    model = toy_model()
    attn = model.blocks[0].attention

    def boom(self, layer, rows):
        raise RuntimeError("boom")

    monkeypatch.setattr(entropy.PatternStats, "add_rows", boom)  # both routes reduce through it
    for route in ("qk", "pattern"):
        with pytest.raises(RuntimeError, match="boom"):
            entropy.run(model, tokens(), route=route)
        assert not attn.hook_pattern._forward_hooks and attn.use_fused()  # back on the fused path
        assert not attn.hook_q._forward_hooks and not attn.hook_k._forward_hooks


# ---------------------------------------------------------------- agreement with run_with_cache

def full_cache_entropy(model, toks: torch.Tensor) -> tuple[list, list]:
    _, cache = model.run_with_cache(toks, names_filter=lambda n: n.endswith("hook_pattern"))
    n_layers = model.cfg.n_layers
    pats = [cache[f"blocks.{l}.attn.hook_pattern"].double() for l in range(n_layers)]
    return ([entropy.series_entropy(p).tolist() for p in pats],
            [entropy.normalized_entropy(p).mean(dim=(0, 2)).tolist() for p in pats])


def test_agrees_with_run_with_cache_on_our_model():
    torch.manual_seed(1)
    model = build_model(get_preset("tiny_shakespeare_gpt_small")).eval()
    toks = torch.randint(0, model.cfg.d_vocab, (6, model.cfg.n_ctx))
    ent, norm = full_cache_entropy(model, toks)
    result = entropy.run(model, toks, batch_size=4)  # two batches, accumulated
    assert_grid(result.entropy, ent)
    assert_grid(result.entropy_normalized, norm)


def test_agrees_with_run_with_cache_on_a_transformer_bridge():
    from transformer_lens import TransformerBridge
    bridge = TransformerBridge.boot_native({"n_layers": 2, "d_model": 32, "n_heads": 4, "d_head": 8,
                                            "d_mlp": 64, "d_vocab": 50, "n_ctx": 16, "act_fn": "gelu",
                                            "normalization_type": "LN", "seed": 0})
    bridge.eval()
    toks = torch.randint(0, 50, (5, 16), generator=torch.Generator().manual_seed(2))
    ent, norm = full_cache_entropy(bridge, toks)
    result = entropy.run(bridge, toks, batch_size=2)
    assert_grid(result.entropy, ent)
    assert_grid(result.entropy_normalized, norm)
    assert not bridge.blocks[0].attn.hook_pattern._forward_hooks


# ---------------------------------------------------------------- runner input errors

def test_runner_rejects_bad_input():
    model = toy_model()
    with pytest.raises(ProbeInputError, match="no attention"):
        entropy.run(build_model(get_preset("char_mlp_small")), tokens())
    with pytest.raises(ProbeInputError, match="no tokens"):
        entropy.run(model, torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(ProbeInputError, match="outside the vocabulary"):
        entropy.run(model, torch.tensor([[1, 2, 7]]))
    with pytest.raises(ProbeInputError, match="layer 3 is out of range"):
        entropy.run(model, tokens(), layer=3)
    with pytest.raises(ProbeInputError, match="head 2 is out of range"):
        entropy.run(model, tokens(), head=2)


# ---------------------------------------------------------------- CLI

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n"
PRESET = "transformer4_rms_small"
LAYERS, HEADS = get_preset(PRESET).n_layers, get_preset(PRESET).n_heads


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    from models.checkpoint import save_snapshot
    from models.tokenizers import CharTokenizer
    tok = CharTokenizer.from_text(TEXT)
    torch.manual_seed(0)
    model = build_model(get_preset(PRESET, d_vocab=tok.vocab_size))
    return save_snapshot(tmp_path_factory.mktemp("ckpt") / "snap", model, tok, step=3)



def test_cli_json(snapshot, capsys):
    assert entropy.main(["--ckpt", str(snapshot), "--text", TEXT * 2, "--json", "--device", "cpu"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["entropy"]) == LAYERS and len(out["entropy"][0]) == HEADS
    assert len(out["entropy_normalized"]) == LAYERS and len(out["entropy_normalized"][1]) == HEADS
    assert out["tokens"] == 2 * len(TEXT) and out["windows"] == math.ceil(2 * len(TEXT) / 16)
    assert out["model"] == "snap"


def test_cli_human_shows_series_shape(snapshot, capsys, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT * 5)
    argv = ["--ckpt", str(snapshot), "--data", str(corpus), "--samples", "5", "--per-position", "--device", "cpu"]
    assert entropy.main(argv) == 0
    out = capsys.readouterr().out
    assert "{0: [" in out and "1: [" in out and f"L{LAYERS - 1}H{HEADS - 1}:" in out


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_cli_one_token_says_why_the_normalised_entropy_is_nan(snapshot, capsys, json_flag):
    assert entropy.main(["--ckpt", str(snapshot), "--text", "F", *json_flag]) == 0
    captured = capsys.readouterr()
    assert ("nan" in captured.out) != bool(json_flag)  # JSON: null
    assert captured.err == ("warning: every window is one token long: its one row sees one key, which gives no "
                            "normalised entropy (H / ln 1 = 0 / 0: nan, JSON null; the entropy itself is 0); "
                            "give 2+ tokens\n")
    assert entropy.main(["--ckpt", str(snapshot), "--text", "Fi"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("extra, message", [
    (["--text", ""], "empty"),
    (["--text", "xyz~"], "~"),
    (["--text", TEXT, "--layer", str(LAYERS)], f"layer {LAYERS} is out of range"),
    (["--text", TEXT, "--head", "-1"], "head -1 is out of range"),
    ([], "--text"),
])
def test_cli_bad_input_is_one_line_and_exit_2(snapshot, capsys, extra, message):
    assert entropy.main(["--ckpt", str(snapshot), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err


def test_cli_model_without_attention(tmp_path, capsys):
    from models.checkpoint import save_snapshot
    from models.tokenizers import CharTokenizer
    tok = CharTokenizer.from_text(TEXT)
    snap = save_snapshot(tmp_path / "mlp", build_model(get_preset("char_mlp_small", d_vocab=tok.vocab_size)), tok)
    assert entropy.main(["--ckpt", str(snap), "--text", TEXT]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "no attention" in err


def test_runner_evaluates_in_eval_mode_and_restores_the_mode():
    torch.manual_seed(3)
    model = build_model(get_preset("tiny_shakespeare_gpt_small"))  # dropout 0.2, built in train mode
    toks = torch.randint(0, model.cfg.d_vocab, (2, model.cfg.n_ctx))
    first, second = entropy.run(model, toks), entropy.run(model, toks)
    assert first.entropy == second.entropy and model.training


def test_non_causal_pattern_is_refused():
    stats = entropy.PatternStats([0], 1, 3)
    with pytest.raises(ProbeInputError, match="not causal"):
        stats.update(0, torch.full((1, 1, 3, 3), 1 / 3))
    stats.update(0, torch.full((1, 1, 3, 3), float("nan")))  # a diverged head is not refused
