"""GPTs whose attention scores are a `torch.einsum`, with `masked_fill(-inf)` from a causal-mask
buffer and `softmax(-1)`; blocks under `layers`, embeddings in a ModuleDict `emb.tok` /
`emb.where`, a `final` norm and an `out` layer; forward returns the logits only. Nothing on them
names their context: no config, no attribute, a position table and a mask buffer under names
nobody guesses. Each takes `vocab=` (the Monitor's `model_args`), so
`--model-code tests/gpt_kit/einsum.py:NAME` rebuilds it from a snapshot (torch only: self-contained).

- `EinsumGPT`: the tutorial's names (`layers.N.norm1|attn|norm2|ff`, `attn.to_q|to_k|to_v|proj`
  with biases, a `causal` buffer True where a key is seen, `n_heads`); 64 positions, width 32.
- `DeltaGPT`: EinsumGPT's function with `x = x + block(x)` in the parent: its blocks return only
  what they add (the tutorial style whose parent adds the residual).
- `HandEinsumGPT`: the same computation under names none of our name lists were written for
  (`layers.N.n1|n2|mix|ff`, bias-free `mix.to_q|to_k|to_v`, `mix.to_out`, a `hidden` buffer True
  where a key is masked, `heads`); `layers.N.ff` a Sequential with `nn.GELU` at `ff.1` or, with
  `gelu_module=False`, two Linears and `F.gelu` called between them; 16 positions, width 16.
  Kept apart from EinsumGPT, not a switch on it: tests pin both sets of names (the grouping by
  layout is checked on names no pattern knows) and their seeded weights.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

CONTEXT, WIDTH, HEADS, LAYERS = 64, 32, 4, 2


class EinsumAttention(nn.Module):
    def __init__(self, d: int, n_heads: int, context: int):
        super().__init__()
        self.n_heads = n_heads
        self.to_q, self.to_k, self.to_v = (nn.Linear(d, d) for _ in range(3))
        self.proj = nn.Linear(d, d)
        self.register_buffer("causal", torch.tril(torch.ones(context, context, dtype=torch.bool)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = (f(x).view(b, n, self.n_heads, d // self.n_heads) for f in (self.to_q, self.to_k, self.to_v))
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d // self.n_heads)  # [b h q k]
        weights = scores.masked_fill(~self.causal[:n, :n], float("-inf")).softmax(-1)
        return self.proj(torch.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, n, d))


class EinsumBlock(nn.Module):
    def __init__(self, d: int, n_heads: int, context: int):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(d), EinsumAttention(d, n_heads, context)
        self.norm2, self.ff = nn.LayerNorm(d), nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.ff(self.norm2(x))


class EinsumGPT(nn.Module):
    def __init__(self, vocab: int = 40, d: int = WIDTH, n_heads: int = HEADS, n_layers: int = LAYERS,
                 context: int = CONTEXT):
        super().__init__()
        self.emb = nn.ModuleDict({"tok": nn.Embedding(vocab, d), "where": nn.Embedding(context, d)})
        self.layers = nn.ModuleList(EinsumBlock(d, n_heads, context) for _ in range(n_layers))
        self.final, self.out = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        where = torch.arange(idx.shape[1], device=idx.device)
        x = self.emb["tok"](idx) + self.emb["where"](where)
        for layer in self.layers:
            x = layer(x)
        return self.out(self.final(x))


class DeltaBlock(EinsumBlock):
    """The tutorial style whose parent adds the residual: the block returns only what it adds."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        added = self.attn(self.norm1(x))
        return added + self.ff(self.norm2(x + added))


class DeltaGPT(EinsumGPT):
    """EinsumGPT's function with `x = x + block(x)` in the parent: its weights load into one and
    give the same logits, and the same residual stream at every layer."""

    def __init__(self, vocab: int = 40, d: int = WIDTH, n_heads: int = HEADS, n_layers: int = LAYERS,
                 context: int = CONTEXT):
        super().__init__(vocab, d, n_heads, n_layers, context)
        self.layers = nn.ModuleList(DeltaBlock(d, n_heads, context) for _ in range(n_layers))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        where = torch.arange(idx.shape[1], device=idx.device)
        x = self.emb["tok"](idx) + self.emb["where"](where)
        for layer in self.layers:
            x = x + layer(x)
        return self.out(self.final(x))


# ---------------------------------------------------------------- names no list knows

class HandEinsumAttention(nn.Module):
    def __init__(self, d: int, heads: int, context: int):
        super().__init__()
        self.heads = heads
        self.to_q, self.to_k, self.to_v = (nn.Linear(d, d, bias=False) for _ in range(3))
        self.to_out = nn.Linear(d, d)
        self.register_buffer("hidden", torch.ones(context, context, dtype=torch.bool).triu(1))

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = (f(x).view(b, n, self.heads, -1) for f in (self.to_q, self.to_k, self.to_v))
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / (d // self.heads) ** 0.5
        p = scores.masked_fill(self.hidden[:n, :n], float("-inf")).softmax(-1)  # [batch head q k]
        return self.to_out(torch.einsum("bhqk,bkhd->bqhd", p, v).reshape(b, n, d))


class HandEinsumBlock(nn.Module):
    def __init__(self, d: int, heads: int, context: int, gelu_module: bool):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.mix = HandEinsumAttention(d, heads, context)
        self.gelu_module = gelu_module
        self.ff = (nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)) if gelu_module
                   else nn.Sequential(nn.Linear(d, 4 * d), nn.Linear(4 * d, d)))

    def forward(self, x):
        x = x + self.mix(self.n1(x))
        h = self.n2(x)
        return x + (self.ff(h) if self.gelu_module else self.ff[1](F.gelu(self.ff[0](h))))


class HandEinsumGPT(nn.Module):
    def __init__(self, vocab: int = 12, d: int = 16, heads: int = 2, layers: int = 2,
                 context: int = 16, gelu_module: bool = True):
        super().__init__()
        self.emb = nn.ModuleDict({"tok": nn.Embedding(vocab, d), "where": nn.Embedding(context, d)})
        self.layers = nn.ModuleList(HandEinsumBlock(d, heads, context, gelu_module) for _ in range(layers))
        self.final = nn.LayerNorm(d)
        self.out = nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.emb["tok"](ids) + self.emb["where"](torch.arange(ids.shape[1], device=ids.device))
        for layer in self.layers:
            x = layer(x)
        return self.out(self.final(x))
