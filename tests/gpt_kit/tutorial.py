"""The tutorial GPTs, in our own words, each able to hand back its own attention patterns: the
reference the attention tap (`models.tap`) is checked against. CPU-fast; self-contained (torch
only), so `--model-code tests/gpt_kit/tutorial.py:NAME` rebuilds any of them from a snapshot.

- `PerHeadGPT`: one module per head, a softmax over `[batch q k]` (an `nn.Softmax` submodule in
  layer 0, `torch.softmax` after; W_query, W_key, W_value, out_proj, ff, norm1, tok_emb, pos_emb,
  out_head): the tutorial-book layout.
- `BatchedGPT`: one packed `qkv`, `F.softmax` over `[batch head q k]` (proj, ffwd, ln1,
  token_embedding_table): the video-tutorial layout.
- `SplitGPT`: separate `query`, `key`, `value` Linears, `F.softmax` over `[batch head q k]`, a tied
  unembedding (`wte`, `wpe`, `h`, `ln_f`, `lm_head`).
- `SdpaGPT`: packed `qkv` and `F.scaled_dot_product_attention(is_causal=True)`.
- `MhaGPT`: blocks on `nn.MultiheadAttention` (its SDPA path, or its softmax with need_weights).

Every model here keeps the patterns of its last forward in `model.patterns` ([batch head q k] per
layer; SdpaGPT after `set_explicit(True)`, MhaGPT with `need_weights`): `gpt_kit.own_patterns`.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, CTX, D, HEADS = 50, 32, 32, 4


def tokens(batch: int = 2, pos: int = 16, seed: int = 0, vocab: int = VOCAB) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, pos), generator=torch.Generator().manual_seed(seed))


def causal_hidden(n: int, device=None) -> torch.Tensor:
    """True above the diagonal: the keys row i may not see. [n n]"""
    return torch.ones(n, n, dtype=torch.bool, device=device).triu(1)


# ---------------------------------------------------------------- one module per head

class Head(nn.Module):
    """One head; with `softmax_module` its softmax is an `nn.Softmax` submodule (else torch.softmax)."""

    def __init__(self, d: int, d_head: int, owner: "PerHeadGPT", softmax_module: bool = False):
        super().__init__()
        self.W_query = nn.Linear(d, d_head, bias=False)
        self.W_key = nn.Linear(d, d_head, bias=False)
        self.W_value = nn.Linear(d, d_head, bias=False)
        self.softmax = nn.Softmax(dim=-1) if softmax_module else None
        self.keep = owner.kept

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)  # [batch pos d_head]
        n = x.shape[1]
        scores = q @ k.transpose(1, 2) / math.sqrt(k.shape[-1])  # [batch q k]
        scores = scores.masked_fill(causal_hidden(n, x.device), float("-inf"))
        weights = torch.softmax(scores, dim=-1) if self.softmax is None else self.softmax(scores)
        self.keep.append(weights.detach())
        return weights @ v


class PerHeadAttention(nn.Module):
    def __init__(self, d: int, n_heads: int, owner: "PerHeadGPT", softmax_module: bool = False):
        super().__init__()
        self.heads = nn.ModuleList(Head(d, d // n_heads, owner, softmax_module) for _ in range(n_heads))
        self.out_proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(torch.cat([h(x) for h in self.heads], dim=-1))


class PerHeadBlock(nn.Module):
    def __init__(self, d: int, n_heads: int, owner: "PerHeadGPT", softmax_module: bool = False):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.att = PerHeadAttention(d, n_heads, owner, softmax_module)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.att(self.norm1(x))
        return x + self.ff(self.norm2(x))


class PerHeadGPT(nn.Module):
    def __init__(self, n_layers: int = 2, n_heads: int = HEADS, d: int = D, ctx: int = CTX, vocab: int = VOCAB):
        super().__init__()
        self.kept: list[torch.Tensor] = []  # [batch q k] per head, in call order
        self.n_heads, self.context_length = n_heads, ctx
        self.tok_emb, self.pos_emb = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        # layer 0's heads take an nn.Softmax submodule, the others torch.softmax
        self.trf_blocks = nn.Sequential(*[PerHeadBlock(d, n_heads, self, l == 0) for l in range(n_layers)])
        self.final_norm = nn.LayerNorm(d)
        self.out_head = nn.Linear(d, vocab, bias=False)

    @property
    def patterns(self) -> list[torch.Tensor]:
        """[batch head q k] per layer, from the heads' own softmax."""
        h = self.n_heads
        return [torch.stack(self.kept[i:i + h], dim=1) for i in range(0, len(self.kept), h)]

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        self.kept.clear()
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.trf_blocks(self.tok_emb(idx) + self.pos_emb(pos))
        return self.out_head(self.final_norm(x))


# ---------------------------------------------------------------- batched heads, packed qkv

class PackedAttention(nn.Module):
    """qkv in one Linear; `explicit` decides softmax-by-hand or SDPA; `sink` keeps patterns."""

    def __init__(self, d: int, n_heads: int, explicit: bool, sink: list):
        super().__init__()
        self.n_heads, self.explicit, self.sink = n_heads, explicit, sink
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (t.view(b, n, self.n_heads, d // self.n_heads).transpose(1, 2) for t in (q, k, v))
        if self.explicit:  # [batch head q k]
            att = (q @ k.transpose(-2, -1)) * k.shape[-1] ** -0.5
            att = F.softmax(att.masked_fill(causal_hidden(n, x.device), float("-inf")), dim=-1)
            self.sink.append(att.detach())
            y = att @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, n, d))


class PackedBlock(nn.Module):
    def __init__(self, d: int, n_heads: int, explicit: bool, sink: list):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.sa = PackedAttention(d, n_heads, explicit, sink)
        self.ffwd = nn.Sequential(nn.Linear(d, 4 * d), nn.ReLU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.sa(self.ln1(x))
        return x + self.ffwd(self.ln2(x))


class BatchedGPT(nn.Module):
    explicit = True

    def __init__(self, n_layers: int = 2, n_heads: int = HEADS, d: int = D, ctx: int = CTX, vocab: int = VOCAB):
        super().__init__()
        self.patterns: list[torch.Tensor] = []
        self.block_size = ctx
        self.token_embedding_table = nn.Embedding(vocab, d)
        self.position_embedding_table = nn.Embedding(ctx, d)
        self.blocks = nn.Sequential(*[PackedBlock(d, n_heads, self.explicit, self.patterns) for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab)

    def set_explicit(self, explicit: bool) -> None:
        for block in self.blocks:
            block.sa.explicit = explicit

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        self.patterns.clear()
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.blocks(self.token_embedding_table(idx) + self.position_embedding_table(pos))
        logits = self.lm_head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss  # the tutorial's (logits, loss) tuple


class SplitAttention(nn.Module):
    """Batched heads from separate `query`, `key`, `value` Linears, `F.softmax` over [batch head q k]."""

    def __init__(self, d: int, n_heads: int, sink: list):
        super().__init__()
        self.n_heads, self.sink = n_heads, sink
        self.query, self.key, self.value = (nn.Linear(d, d, bias=False) for _ in range(3))
        self.out = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = (f(x).view(b, n, self.n_heads, -1).transpose(1, 2) for f in (self.query, self.key, self.value))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.shape[-1])  # [batch head q k]
        att = F.softmax(att.masked_fill(causal_hidden(n, x.device), float("-inf")), dim=-1)
        self.sink.append(att.detach())
        return self.out((att @ v).transpose(1, 2).reshape(b, n, d))


class SplitBlock(nn.Module):
    def __init__(self, d: int, n_heads: int, sink: list):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = SplitAttention(d, n_heads, sink)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class SplitGPT(nn.Module):
    """Separate query / key / value Linears, batched softmax; a tied unembedding; (logits, loss)."""

    def __init__(self, n_layers: int = 2, n_heads: int = HEADS, d: int = D, ctx: int = CTX, vocab: int = VOCAB):
        super().__init__()
        self.patterns: list[torch.Tensor] = []  # [batch head q k] per layer, from its own softmax
        self.context_length = ctx
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.h = nn.ModuleList(SplitBlock(d, n_heads, self.patterns) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        self.patterns.clear()
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss


class SdpaGPT(BatchedGPT):
    """BatchedGPT on `F.scaled_dot_product_attention`; `set_explicit(True)` for its patterns."""
    explicit = False


# ---------------------------------------------------------------- nn.MultiheadAttention

class MhaGPT(nn.Module):
    """Blocks on torch's `nn.MultiheadAttention` with a causal boolean mask; `need_weights` picks
    its SDPA path (False) or its explicit softmax (True); `patterns` are the module's own weights."""

    def __init__(self, n_layers: int = 2, n_heads: int = HEADS, d: int = D, ctx: int = CTX, vocab: int = VOCAB):
        super().__init__()
        self.need_weights, self.patterns, self.block_size = False, [], ctx
        self.tok_emb, self.pos_emb = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.attns = nn.ModuleList(nn.MultiheadAttention(d, n_heads, batch_first=True) for _ in range(n_layers))
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(n_layers))
        self.out_head = nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        self.patterns.clear()
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(idx.shape[1], device=idx.device))
        for attn, norm in zip(self.attns, self.norms):
            h = norm(x)
            y, w = attn(h, h, h, attn_mask=causal_hidden(idx.shape[1], idx.device), need_weights=self.need_weights,
                        average_attn_weights=False)
            if w is not None:
                self.patterns.append(w.detach())  # [batch head q k]
            x = x + y
        return self.out_head(x)
