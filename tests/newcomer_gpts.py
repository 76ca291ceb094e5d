"""Two GPTs as a newcomer writes them after a tutorial or two, in our own words; tiny and CPU-fast.
Each takes `vocab=` (the Monitor's `model_args`), so `--model-code tests/newcomer_gpts.py:NAME`
rebuilds it from a snapshot.

- `LlamaGPT`: rotary positions, its own RMSNorm module, SwiGLU (the SiLU a function call), one fused
  `wqkv`, `F.scaled_dot_product_attention(is_causal=True)`, the output layer tied to the token
  table, and its context in `max_seq_len`.
- `EinsumGPT`: scores by `torch.einsum`, `masked_fill(-inf)` from a causal-mask buffer, `softmax(-1)`;
  blocks under `layers`, embeddings in a ModuleDict `emb.tok` / `emb.where`, a `final` norm and an
  `out` layer; its forward returns the logits only. Nothing on it names its context: no config,
  no attribute, a position table and a mask buffer under names nobody guesses (`where`, `causal`).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

CONTEXT, WIDTH, HEADS, LAYERS = 64, 32, 4, 2


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(n: int, d_head: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [n d_head/2] of positions 0..n-1 at the usual frequencies (base 10000)."""
    freq = 1.0 / 10000 ** (torch.arange(0, d_head, 2, device=device).float() / d_head)
    angle = torch.arange(n, device=device).float()[:, None] * freq[None, :]
    return angle.cos(), angle.sin()


def turn(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [batch head pos d_head] rotated pairwise (even, odd) by its position's angle."""
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


class LlamaAttention(nn.Module):
    def __init__(self, d: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.wqkv = nn.Linear(d, 3 * d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.wqkv(x).view(b, n, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)  # [b h n dh] each
        y = F.scaled_dot_product_attention(turn(q, cos, sin), turn(k, cos, sin), v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, n, d))


class SwiGLU(nn.Module):
    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.w1, self.w3 = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class LlamaBlock(nn.Module):
    def __init__(self, d: int, n_heads: int):
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(d), LlamaAttention(d, n_heads)
        self.ffn_norm, self.ffn = RMSNorm(d), SwiGLU(d, 2 * d)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.ffn(self.ffn_norm(x))


class LlamaGPT(nn.Module):
    def __init__(self, vocab: int = 40, d: int = WIDTH, n_heads: int = HEADS, n_layers: int = LAYERS,
                 max_seq_len: int = CONTEXT):
        super().__init__()
        self.max_seq_len, self.d_head = max_seq_len, d // n_heads
        self.tok_embeddings = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(LlamaBlock(d, n_heads) for _ in range(n_layers))
        self.norm = RMSNorm(d)
        self.output = nn.Linear(d, vocab, bias=False)
        self.output.weight = self.tok_embeddings.weight  # tied: one table in and out

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        cos, sin = rotary(idx.shape[1], self.d_head, idx.device)
        x = self.tok_embeddings(idx)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.output(self.norm(x))


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


def train_with_monitor(model: nn.Module, out, tokenizer, text: str, steps: int = 3, **monitor) -> nn.Module:
    """A few AdamW steps on rows of a whole context of `text` with the Monitor's three lines (a
    snapshot at step 0 and, when it closes, at the last step), as a newcomer's loop would; the model
    back in eval mode."""
    from train.monitor import Monitor

    ids = torch.tensor(tokenizer.encode(text))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    settings = {"log_every": 1, "save_every": 100, "report": False, "model_args": {"vocab": tokenizer.vocab_size},
                "eval_tokens": ids[: 2 * CONTEXT].view(2, CONTEXT), **monitor}
    with Monitor(model, optimizer, out, tokenizer=tokenizer, **settings) as m:
        for step in range(steps):
            start = torch.tensor([0, 7, 13, 21]) + step
            x = torch.stack([ids[s:s + CONTEXT + 1] for s in start])  # [batch pos+1]
            loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            m.log(step, train_loss=loss.item())
    return model.eval()
