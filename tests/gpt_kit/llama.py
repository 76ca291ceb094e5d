"""Llama-style GPTs as people write them by hand: rotary positions, their own RMSNorm module, a
SwiGLU MLP (the SiLU a function call), one fused `wqkv` Linear,
`F.scaled_dot_product_attention(is_causal=True)`, the output layer tied to the token table, the
context in `max_seq_len`. Each takes `vocab=`, so `--model-code tests/gpt_kit/llama.py:NAME`
rebuilds it from a snapshot (torch only: self-contained).

- `LlamaGPT`: Meta's names (`tok_embeddings`, `blocks.N.attn_norm|attn|ffn_norm|ffn.w1|w2|w3`,
  `norm`, `output`), an RMSNorm `weight`, rotary on (even, odd) pairs; 64 positions, width 32.
- `HandLlama`: names none of our name lists were written for (`tok`, `layers.N.pre_attn|attn|
  pre_mlp|mlp.gate|up|down`, `norm_f`, `lm`), an RMSNorm `gain`, rotary on the two halves; 16
  positions, width 16. Kept apart from LlamaGPT: tests pin its names (the grouping by layout is
  checked on them) and the rotary pairing changes the function.
"""

from __future__ import annotations

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


# ---------------------------------------------------------------- names no list knows

class OwnRMSNorm(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return self.gain * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def rotate_halves(x: torch.Tensor) -> torch.Tensor:
    """Rotary positions on [batch head pos d_head], the two halves as the pairs."""
    n, d = x.shape[-2], x.shape[-1]
    freq = 1.0 / 10000 ** (torch.arange(0, d, 2, device=x.device).float() / d)
    angle = torch.arange(n, device=x.device).float()[:, None] * freq  # [pos d_head/2]
    a, b = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()], -1)


class HandAttention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.wqkv = nn.Linear(d, 3 * d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)

    def forward(self, x):  # [batch pos d]
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.heads, -1).transpose(1, 2) for t in self.wqkv(x).chunk(3, -1))
        y = F.scaled_dot_product_attention(rotate_halves(q), rotate_halves(k), v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, n, d))


class HandSwiGLU(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(d, 2 * d, bias=False), nn.Linear(d, 2 * d, bias=False), \
            nn.Linear(2 * d, d, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class HandBlock(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.pre_attn, self.pre_mlp = OwnRMSNorm(d), OwnRMSNorm(d)
        self.attn, self.mlp = HandAttention(d, heads), HandSwiGLU(d)

    def forward(self, x):
        x = x + self.attn(self.pre_attn(x))
        return x + self.mlp(self.pre_mlp(x))


class HandLlama(nn.Module):
    def __init__(self, vocab: int = 12, d: int = 16, heads: int = 2, layers: int = 2,
                 max_seq_len: int = 16):
        super().__init__()
        self.max_seq_len = max_seq_len
        self.tok = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(HandBlock(d, heads) for _ in range(layers))
        self.norm_f = OwnRMSNorm(d)
        self.lm = nn.Linear(d, vocab, bias=False)
        self.lm.weight = self.tok.weight  # tied

    def forward(self, ids):  # [batch pos] -> [batch pos vocab]
        x = self.tok(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm(self.norm_f(x))
