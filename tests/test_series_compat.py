"""Our presets reproduce the series' own models: a series state_dict loads with strict=True and
gives the same logits, the same parameter names and the same attention entropy.

The `Series*` classes below are the series' code (shared/seeds/series-blog.txt, the attention and
transformer posts), copied as written; only class names are suffixed where the series redefines
a class in a later post (its first `MLP` maps to the vocabulary, the later one back to d; its
first `Attention` has no sqrt(d) scaling). `math`/`torch`/`nn` are used exactly as in the posts.
The series adds `W_pos` of shape (n, d) to every input, so inputs have exactly n tokens.
"""

from __future__ import annotations

import math

import pytest
import torch
from close import assert_close_to_scale
from torch import nn

from models import build_model, get_preset
from models.transformer import series_key

# small dimensions for the series instances (the presets' own are 2048/32/256/2048)
VOCAB, N, D, H, D_K, MLP_DH, MLP_DEPTH = 50, 8, 32, 4, 8, 64, 2


class Tokenizer:
    """Stand-in for the series' tokenizer: the models only read `.vocab_size`."""

    vocab_size = VOCAB


# ---- the series' code ------------------------------------------------------------------------

class SeriesMLPToVocab(nn.Module):  # series: first `MLP` (attention post), d_out = vocab
    def __init__(self, d, d_hidden, d_out, n_layers):
        super().__init__()
        layers = []
        for _ in range(n_layers):
            layers.extend([nn.Linear(d, d_hidden), nn.ReLU()])
            d = d_hidden
        layers.append(nn.Linear(d_hidden, d_out))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor):
        return self.net(x)


class SeriesMLP(nn.Module):  # series: `MLP` "make sure the output is the same shape as the input"
    def __init__(self, d, d_hidden, n_layers):
        super().__init__()
        layers = []
        d_in = d
        for _ in range(n_layers):
            layers.extend([nn.Linear(d, d_hidden), nn.ReLU()])
            d = d_hidden
        layers.append(nn.Linear(d_hidden, d_in))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor):
        return self.net(x)


class SeriesAttentionNoScale(nn.Module):  # series: first `Attention` (entropy collapses to 0.003)
    def __init__(self, n, d):
        super().__init__()
        self.n = n
        self.d = d
        self.sqrt_d = torch.sqrt(torch.tensor(d))
        self.last_entropy = float('-inf')

        self.W_Q = nn.Parameter(torch.randn(d, d))
        self.W_K = nn.Parameter(torch.randn(d, d))
        self.W_V = nn.Parameter(torch.randn(d, d))

    def forward(self, x: torch.Tensor):
        n, sqrt_d = self.n, self.sqrt_d
        W_Q, W_K, W_V = self.W_Q, self.W_K, self.W_V

        # attention mask
        attn = (torch.masked_fill(
            (x @ W_Q) @ (x @ W_K).transpose(-2, -1),
            torch.triu(
                torch.ones(n, n, dtype=torch.bool, device=x.device),
                diagonal=1
            ),
            float('-inf')
        )).softmax(dim=-1)
        # track attn mask entropy for debugging
        self.last_entropy = -(attn * (attn + 1e-10).log()).sum(dim=-1).mean().item()

        return attn @ (x @ W_V)


class SeriesAttention(nn.Module):  # series: `Attention` with sqrt(d) scaling and d_k (d_k=d: full rank)
    def __init__(self, n, d, d_k=None):
        super().__init__()
        d_k = d if d_k is None else d_k
        self.n = n
        self.d = d
        self.sqrt_d = torch.sqrt(torch.tensor(d))
        self.last_entropy = float('-inf')

        self.W_Q = nn.Parameter(torch.randn(d, d_k) / self.sqrt_d)
        self.W_K = nn.Parameter(torch.randn(d, d_k) / self.sqrt_d)
        self.W_V = nn.Parameter(torch.randn(d, d_k) / self.sqrt_d)

    def forward(self, x: torch.Tensor):
        n, sqrt_d = self.n, self.sqrt_d
        W_Q, W_K, W_V = self.W_Q, self.W_K, self.W_V

        attn = (torch.masked_fill(
            (x @ W_Q) @ (x @ W_K).transpose(-2, -1),
            torch.triu(
                torch.ones(n, n, dtype=torch.bool, device=x.device),
                diagonal=1
            ),
            float('-inf')
        ) / sqrt_d).softmax(dim=-1)
        self.last_entropy = -(attn * (attn + 1e-10).log()).sum(dim=-1).mean().item()

        return attn @ (x @ W_V)


# (n, d) x h -> concat -> (n, dh) @ (dh, d) -> (n, d)
class SeriesMultiHeadAttentionFullRank(nn.Module):  # series: naive `MultiHeadAttention(n, d, h)`
    def __init__(self, n, d, h):
        super().__init__()
        self.heads = nn.ModuleList([SeriesAttention(n, d) for _ in range(h)])
        self.W_O = nn.Parameter(torch.randn(d * h, d) / math.sqrt(d))

    def forward(self, x: torch.Tensor):
        return torch.cat([h(x) for h in self.heads], dim=-1) @ self.W_O


class SeriesMultiHeadAttention(nn.Module):  # series: dimension-reduced `MultiHeadAttention`
    def __init__(self, n, d, h, d_k):
        super().__init__()
        self.heads = nn.ModuleList([SeriesAttention(n, d, d_k) for _ in range(h)])
        self.W_O = nn.Parameter(torch.randn(d_k * h, d) / math.sqrt(d_k * h))

    def forward(self, x: torch.Tensor):
        return torch.cat([h(x) for h in self.heads], dim=-1) @ self.W_O


class SeriesAttnNet(nn.Module):  # series: `AttnNet`, no residual, the MLP maps to the vocabulary
    def __init__(self, tokenizer, n, d, mlp_dh, mlp_depth, attention_cls=SeriesAttention):
        super().__init__()
        self.n = n
        self.d = d
        self.d_h = mlp_dh
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size

        self.W_pos = nn.Parameter(torch.randn(n, d))
        self.embedding = nn.Embedding(self.vocab_size, d)
        self.attention = attention_cls(n, d)
        self.mlp = SeriesMLPToVocab(d, mlp_dh, self.vocab_size, mlp_depth)

    # x: (b, n) |-> (b, n, d)       (b=batch dimension)
    def forward(self, x: torch.Tensor):
        x = self.embedding(x) + self.W_pos  # (b,n) |-> (b,n,d)
        x = self.attention(x)               # (b,n,d) |-> (b,n,d)
        return self.mlp(x)                  # (b,n,d) |-> (b,n,vocab_size)


class SeriesAttnNetResidual(nn.Module):
    """series: `AttnNet` with residuals and W_out; the multi-head post swaps in
    `MultiHeadAttention` for `self.attention` (given here as `attention`)."""

    def __init__(self, tokenizer, n, d, mlp_dh, mlp_depth, attention=None):
        super().__init__()
        self.n = n
        self.d = d
        self.d_h = mlp_dh
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size

        self.W_pos = nn.Parameter(torch.randn(n, d))
        self.embedding = nn.Embedding(self.vocab_size, d)
        self.attention = SeriesAttention(n, d) if attention is None else attention
        self.mlp = SeriesMLP(d, mlp_dh, mlp_depth)
        self.W_out = nn.Parameter(torch.randn(d, self.vocab_size) / math.sqrt(d))

    # x: (b, n) |-> (b, n, vocab_size)
    def forward(self, x: torch.Tensor):
        x = self.embedding(x) + self.W_pos  # (b,n)   |-> (b,n,d)
        x = x + self.attention(x)           # (b,n,d) |-> (b,n,d)
        x = x + self.mlp(x)                 # (b,n,d) |-> (b,n,d)
        return x @ self.W_out   # (n d)(d vocab_size) = (n, vocab_size)


class SeriesRMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor):
        rms = torch.sqrt(torch.mean(x ** 2, dim=-1, keepdim=True) + 1e-6)
        return self.gamma * (x / rms)


class SeriesTransformerBlock(nn.Module):
    def __init__(self, n, d, h, d_k, mlp_dh, mlp_depth):
        super().__init__()

        self.attention = SeriesMultiHeadAttention(n, d, h, d_k)
        self.mlp = SeriesMLP(d, mlp_dh, mlp_depth)

    def forward(self, x: torch.Tensor):
        x = x + self.attention(x)
        return x + self.mlp(x)


class SeriesTransformerBlockRMS(nn.Module):
    def __init__(self, n, d, h, d_k, mlp_dh, mlp_depth):
        super().__init__()

        self.attention = SeriesMultiHeadAttention(n, d, h, d_k)
        self.mlp = SeriesMLP(d, mlp_dh, mlp_depth)
        self.rms1 = SeriesRMSNorm(d)
        self.rms2 = SeriesRMSNorm(d)

    def forward(self, x: torch.Tensor):
        x = x + self.attention(self.rms1(x))
        return x + self.mlp(self.rms2(x))


class SeriesTransformer(nn.Module):
    def __init__(self, tokenizer, n, d, h, d_k, n_blocks, mlp_dh, mlp_depth,
                 block_cls=SeriesTransformerBlock):
        super().__init__()
        # ... (the post elides these; same as AttnNet)
        self.n = n
        self.d = d
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size
        self.W_pos = nn.Parameter(torch.randn(n, d))
        self.W_out = nn.Parameter(torch.randn(d, self.vocab_size) / math.sqrt(d))
        self.embedding = nn.Embedding(self.vocab_size, d)

        self.blocks = nn.Sequential(*[
            block_cls(n, d, h, d_k, mlp_dh, mlp_depth)
            for _ in range(n_blocks)
        ])

    # x: (b, n) |-> (b, n, vocab_size)
    def forward(self, x: torch.Tensor):
        x = self.embedding(x) + self.W_pos  # (b,n) |-> (b,n,d)
        x = self.blocks(x)                  # (b,n,d) |-> (b,n,d)
        return x @ self.W_out               # (n d)(d vocab_size) = (n, vocab_size)


# ---- preset <-> series model ---------------------------------------------------------------------

def series_model(name: str) -> nn.Module:
    tok = Tokenizer()
    if name == "attn1_noscale":
        return SeriesAttnNet(tok, N, D, MLP_DH, MLP_DEPTH, attention_cls=SeriesAttentionNoScale)
    if name == "attn1_sqrtd":
        return SeriesAttnNet(tok, N, D, MLP_DH, MLP_DEPTH)
    if name == "attn1_residual":
        return SeriesAttnNetResidual(tok, N, D, MLP_DH, MLP_DEPTH)
    if name == "mha4_fullrank":
        return SeriesAttnNetResidual(tok, N, D, MLP_DH, MLP_DEPTH,
                                     attention=SeriesMultiHeadAttentionFullRank(N, D, H))
    if name == "mha4":
        return SeriesAttnNetResidual(tok, N, D, MLP_DH, MLP_DEPTH,
                                     attention=SeriesMultiHeadAttention(N, D, H, D_K))
    if name in ("transformer2", "transformer4"):
        return SeriesTransformer(tok, N, D, H, D_K, int(name[-1]), MLP_DH, MLP_DEPTH)
    if name == "transformer4_rms":
        return SeriesTransformer(tok, N, D, H, D_K, 4, MLP_DH, MLP_DEPTH,
                                 block_cls=SeriesTransformerBlockRMS)
    raise KeyError(name)


def our_config(name: str):
    """The FULL preset with only its sizes shrunk to the series instance's."""
    full = get_preset(name)
    d_head = D if full.d_head == full.d_model else D // full.n_heads
    return full.replace(d_vocab=VOCAB, n_ctx=N, d_model=D, d_head=d_head, d_mlp=MLP_DH)


SERIES_PRESETS = ["attn1_noscale", "attn1_sqrtd", "attn1_residual", "mha4_fullrank", "mha4",
                  "transformer2", "transformer4", "transformer4_rms"]
MULTI_BLOCK = ["transformer2", "transformer4", "transformer4_rms"]


def tokens(batch: int = 4, seed: int = 7) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, N), generator=torch.Generator().manual_seed(seed))


def pair(name: str):
    torch.manual_seed(0)
    series = series_model(name).eval()
    torch.manual_seed(123)  # a different init, so only the loaded state can make them agree
    ours = build_model(our_config(name)).eval()
    return series, ours


def series_heads(series: nn.Module):
    """The series' attention modules per block (they hold `last_entropy`)."""
    if hasattr(series, "blocks"):
        return [list(block.attention.heads) for block in series.blocks]
    att = series.attention
    return [list(att.heads) if hasattr(att, "heads") else [att]]


@pytest.mark.parametrize("name", SERIES_PRESETS)
def test_series_state_dict_loads_and_logits_match(name):
    series, ours = pair(name)
    x = tokens()
    assert (ours(x) - series(x)).abs().max() > 1e-3  # not equal by accident
    state = series.state_dict()
    keys_before = list(state)
    result = ours.load_state_dict(state, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    assert list(state) == keys_before  # the caller's dict is not renamed in place
    with torch.no_grad():
        assert_close_to_scale(ours(x), series(x))
        ours.set_attn_impl("explicit")
        assert_close_to_scale(ours(x), series(x))


@pytest.mark.parametrize("name", SERIES_PRESETS)
def test_loaded_weights_are_the_series_weights(name):
    """Parameter by parameter, after the AttnNet renaming (attention.W_Q -> heads.0.W_Q)."""
    series, ours = pair(name)
    ours.load_state_dict(series.state_dict(), strict=True)
    ours_params = ours.series_parameters()
    for key, value in series.state_dict().items():
        if not key.startswith(("attention.", "mlp.")):
            our_key = key
        elif key.startswith("attention.W_") and key[-1] in "QKV":
            our_key = f"blocks.0.attention.heads.0.{key.split('.')[-1]}"
        else:
            our_key = f"blocks.0.{key}"
        assert series_key(key) == our_key  # the mapping the checkpoint loader uses
        assert torch.equal(ours_params[our_key], value), key


@pytest.mark.parametrize("name", MULTI_BLOCK)
def test_multi_block_names_are_identical(name):
    series, ours = pair(name)
    assert set(series.state_dict()) == set(ours.state_dict())
    assert {k: tuple(v.shape) for k, v in series.state_dict().items()} == \
           {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    # and our state dict loads back into the series' model
    series.load_state_dict(ours.state_dict(), strict=True)
    x = tokens()
    assert_close_to_scale(ours(x), series(x))


# the rows of the series' g/w/u table (transformer4_rms log), names as printed
SERIES_LOG_NAMES = ["W_pos", "W_out", "embedding.weight"] + [
    name for b in range(4) for name in (
        [f"blocks.{b}.attention.W_O"]
        + [f"blocks.{b}.attention.heads.{h}.W_{m}" for h in range(4) for m in "QKV"]
        + [f"blocks.{b}.mlp.net.{i}.{p}" for i in (0, 2, 4) for p in ("weight", "bias")]
        + [f"blocks.{b}.rms{i}.gamma" for i in (1, 2)])]


def test_series_log_parameter_names_and_full_size_shapes():
    """The full transformer4_rms preset has exactly the parameters of the series' logged model."""
    class FullTokenizer:
        vocab_size = 2048

    with torch.device("meta"):
        ours = build_model(get_preset("transformer4_rms"))
        series = SeriesTransformer(FullTokenizer(), 32, 256, 4, 64, 4, 256 * 8, 2,
                                   block_cls=SeriesTransformerBlockRMS)
    ours_params = {k: tuple(v.shape) for k, v in ours.series_parameters().items()}
    series_params = {k: tuple(v.shape) for k, v in series.named_parameters()}
    assert set(SERIES_LOG_NAMES) == set(ours_params)
    assert ours_params == series_params
    assert list(series_params) == SERIES_LOG_NAMES  # the log's row order is named_parameters()
    assert f"{sum(p.numel() for p in series.parameters()) / 1e6:.1f}M" == "23.1M"  # the log's n_params


def test_parameter_order_matches_the_series_log():
    """A g/w/u table printed in series_parameters() order lists rows as the series' log does."""
    with torch.device("meta"):
        ours = build_model(get_preset("transformer4_rms"))
    assert list(ours.series_parameters()) == SERIES_LOG_NAMES


def entropy_series_way(attn: torch.Tensor) -> float:
    return -(attn * (attn + 1e-10).log()).sum(dim=-1).mean().item()


@pytest.mark.parametrize("name", SERIES_PRESETS)
def test_attention_entropy_matches_the_series_log(name):
    series, ours = pair(name)
    ours.load_state_dict(series.state_dict(), strict=True)
    x = tokens(batch=8)
    with torch.no_grad():
        series(x)
        _, cache = ours.run_with_cache(x, names_filter=lambda nm: nm.endswith("hook_pattern"))
    heads = series_heads(series)
    assert len(heads) == ours.cfg.n_layers
    for layer, layer_heads in enumerate(heads):
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"]  # [batch head q k]
        assert pattern.shape[1] == len(layer_heads)
        for h, head in enumerate(layer_heads):
            ours_entropy = entropy_series_way(pattern[:, h])
            assert abs(ours_entropy - head.last_entropy) < 1e-6, (layer, h)


def test_unscaled_attention_collapses_like_the_series():
    """attn1_noscale at init: near one-hot attention, as in the post (entropy 0.003)."""
    series, ours = pair("attn1_noscale")
    ours.load_state_dict(series.state_dict(), strict=True)
    _, cache = ours.run_with_cache(tokens(batch=16), names_filter="blocks.0.attn.hook_pattern")
    collapsed = entropy_series_way(cache["blocks.0.attn.hook_pattern"][:, 0])
    series_s, ours_s = pair("attn1_sqrtd")
    ours_s.load_state_dict(series_s.state_dict(), strict=True)
    _, cache_s = ours_s.run_with_cache(tokens(batch=16), names_filter="blocks.0.attn.hook_pattern")
    scaled = entropy_series_way(cache_s["blocks.0.attn.hook_pattern"][:, 0])
    assert collapsed < 0.1 < scaled


@pytest.mark.parametrize("name", SERIES_PRESETS)
def test_init_distribution_matches_the_series(name):
    """A fresh model of each preset starts from the series' init (same std per parameter)."""
    series, ours = pair(name)
    ours_params = ours.series_parameters()
    for key, value in series.named_parameters():
        mine = ours_params[series_key(key)]
        assert mine.shape == value.shape, key
        if key.endswith("gamma"):
            assert torch.equal(mine, value), key  # ones
        elif value.numel() >= 256:
            ratio = mine.std().item() / value.std().item()
            assert 0.85 < ratio < 1.18, f"{key}: std {mine.std().item():.4f} vs series {value.std().item():.4f}"


def test_the_scale_tolerance_passes_rounding_and_fails_one_wrong_weight():
    """transformer4's logits reach ~20: another CPU's rounding (1.054e-5 on 1 of 1600 logits, past
    an absolute 1e-5) is within 1e-5 of that scale; one weight off by 1e-3 is not."""
    series, ours = pair("transformer4")
    ours.load_state_dict(series.state_dict(), strict=True)
    x = tokens()
    with torch.no_grad():
        want = series(x)
        assert float(want.abs().max()) > 10
        assert_close_to_scale(want + 1.054e-5 * torch.sign(torch.randn_like(want)), want)
        ours.W_out[3, 5] += 1e-3
        with pytest.raises(AssertionError):
            assert_close_to_scale(ours(x), want)
