"""nanochat's layout in our own words (`ChatGPT`: c_q/c_k/c_v/c_proj, rotary, QK-norm, grouped kv
heads, a sliding window as a boolean mask on some layers, relu², untied head, logit softcap; with
`keep=True` its patterns in `model.patterns`), and `nanochat_gpt(n_head, n_embd)`: nanochat's own
GPT, small (window pattern "SL": its short window is 128 keys before the query at sequence_len
512); the test is skipped where nanochat does not import.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .tutorial import CTX, D, HEADS, VOCAB


def rms(x: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions on the two halves of [batch pos head d_head]."""
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    return torch.cat([a * cos + b * sin, b * cos - a * sin], dim=-1)


class ChatAttention(nn.Module):
    def __init__(self, d: int, n_heads: int, n_kv: int, window: int | None, owner: "ChatGPT"):
        super().__init__()
        self.n_heads, self.n_kv, self.d_head, self.window = n_heads, n_kv, d // n_heads, window
        self.__dict__["owner"] = owner  # not a submodule: the model holds this attention
        self.c_q = nn.Linear(d, d, bias=False)
        self.c_k = nn.Linear(d, n_kv * self.d_head, bias=False)
        self.c_v = nn.Linear(d, n_kv * self.d_head, bias=False)
        self.c_proj = nn.Linear(d, d, bias=False)

    def visible(self, n: int, device) -> torch.Tensor:
        """[n n] True where row i may see key j: causal, and within the window where there is one."""
        i = torch.arange(n, device=device)
        seen = i[None, :] <= i[:, None]
        return seen if self.window is None else seen & (i[:, None] - i[None, :] < self.window)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q = self.c_q(x).view(b, n, self.n_heads, self.d_head)
        k = self.c_k(x).view(b, n, self.n_kv, self.d_head)
        v = self.c_v(x).view(b, n, self.n_kv, self.d_head)
        q, k = rms(rotate(q, cos, sin)), rms(rotate(k, cos, sin))  # QK-norm after rotary
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [batch head pos d_head]
        if self.owner.keep:
            group = self.n_heads // self.n_kv
            kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            scores = (q @ kk.transpose(-1, -2)) / math.sqrt(self.d_head)
            p = scores.masked_fill(~self.visible(n, x.device), float("-inf")).softmax(-1)
            self.owner.patterns.append(p.detach())
            y = p @ vv
        elif self.window is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.visible(n, x.device), enable_gqa=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, n, -1))


class ChatBlock(nn.Module):
    def __init__(self, d: int, n_heads: int, n_kv: int, window: int | None, owner: "ChatGPT"):
        super().__init__()
        self.attn = ChatAttention(d, n_heads, n_kv, window, owner)
        self.mlp = nn.ModuleDict({"c_fc": nn.Linear(d, 4 * d, bias=False), "c_proj": nn.Linear(4 * d, d, bias=False)})

    def forward(self, x, cos, sin):
        x = x + self.attn(rms(x), cos, sin)
        return x + self.mlp["c_proj"](F.relu(self.mlp["c_fc"](rms(x))).square())


class ChatGPT(nn.Module):
    """nanochat's layout, in small: window pattern "SL" (short = a quarter of the context). With
    `backout`, recent nanochat's backout: `backout_lambda` times the residual after block
    n_layers // 2 is taken off before the final norm."""

    def __init__(self, n_layers: int = 2, n_heads: int = HEADS, n_kv: int = 2, d: int = D, ctx: int = CTX,
                 vocab: int = VOCAB, softcap: float = 15.0, backout: float | None = None):
        super().__init__()
        self.keep, self.patterns, self.softcap = False, [], softcap
        if backout is not None:
            self.backout_lambda = nn.Parameter(torch.tensor([backout]))
        self.config = type("Config", (), {"sequence_len": ctx})()
        windows = [ctx // 4 if (l % 2 == 0 and l != n_layers - 1) else None for l in range(n_layers)]
        self.transformer = nn.ModuleDict({"wte": nn.Embedding(vocab, d),
                                          "h": nn.ModuleList(ChatBlock(d, n_heads, n_kv, w, self) for w in windows)})
        self.lm_head = nn.Linear(d, vocab, bias=False)
        d_head = d // n_heads
        freqs = 1.0 / 10000 ** (torch.arange(0, d_head, 2).float() / d_head)
        angles = torch.outer(torch.arange(ctx).float(), freqs)  # [pos d_head/2]
        self.register_buffer("cos", angles.cos()[None, :, None, :], persistent=False)
        self.register_buffer("sin", angles.sin()[None, :, None, :], persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        self.patterns.clear()
        n = idx.shape[1]
        cos, sin = self.cos[:, :n], self.sin[:, :n]
        x = rms(self.transformer["wte"](idx))
        middle = None
        for i, block in enumerate(self.transformer["h"]):
            x = block(x, cos, sin)
            middle = x if i == len(self.transformer["h"]) // 2 else middle
        if hasattr(self, "backout_lambda"):
            x = x - self.backout_lambda * middle
        logits = self.lm_head(rms(x))
        return self.softcap * torch.tanh(logits / self.softcap)


def nanochat_gpt(n_head: int = 4, n_embd: int = 64, vocab: int = 64) -> nn.Module:
    import pytest
    gpt = pytest.importorskip("nanochat.gpt")
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(sequence_len=512, vocab_size=vocab, n_layer=2, n_head=n_head, n_kv_head=2,
                                  n_embd=n_embd, window_pattern="SL"))
    model.init_weights()
    return model
