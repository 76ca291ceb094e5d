"""The series' own models (shared/seeds/series-blog.txt, the attention and transformer posts),
copied as written: what tests/test_series_compat.py checks our presets reproduce. Only class names
are suffixed where the series redefines a class in a later post (its first `MLP` maps to the
vocabulary, the later one back to d; its first `Attention` has no sqrt(d) scaling).
`math`/`torch`/`nn` are used exactly as in the posts. The series adds `W_pos` of shape (n, d) to
every input, so inputs have exactly n tokens. `series_model(preset name)` builds the series'
model of one of our presets at small sizes.
"""

from __future__ import annotations

import math

import torch
from torch import nn

# small dimensions for the series instances (the presets' own are 2048/32/256/2048)
VOCAB, N, D, H, D_K, MLP_DH, MLP_DEPTH = 50, 8, 32, 4, 8, 64, 2


class Tokenizer:
    """Stand-in for the series' tokenizer: the models only read `.vocab_size`."""

    vocab_size = VOCAB


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
