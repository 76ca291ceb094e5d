"""Causal multi-head attention with the series' per-head parameters and two equal paths.

Parameters are named as in the series (`heads.{j}.W_Q|W_K|W_V` of shape [d_model d_head], `W_O`
of shape [n_heads*d_head d_model]). The explicit path computes scores and pattern so every hook
fires; the fused path calls `scaled_dot_product_attention` and is taken only when nothing is
hooked on `hook_attn_scores` or `hook_pattern` (and `impl` is "auto" or "fused").
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformer_lens.hook_points import HookPoint

from models.config import TransformerConfig

ATTN_IMPLS = ("auto", "explicit", "fused")


def attention_scale(cfg: TransformerConfig) -> float:
    """The divisor applied to q.k: 1, sqrt(d_model) (the series) or sqrt(d_head) (GPT)."""
    if cfg.attn_scale == "none":
        return 1.0
    if cfg.attn_scale == "sqrt_d_model":
        return math.sqrt(cfg.d_model)
    return math.sqrt(cfg.d_head)


def is_hooked(hook: HookPoint) -> bool:
    """True if anything (TransformerLens or a plain torch hook) observes this hook point."""
    return bool(hook.has_hooks() or hook._forward_hooks or hook._backward_hooks)


class AttentionHead(nn.Module):
    """One head's projections, kept as separate parameters so series state dicts load."""

    def __init__(self, d_model: int, d_head: int, bias: bool):
        super().__init__()
        self.W_Q = nn.Parameter(torch.empty(d_model, d_head))
        self.W_K = nn.Parameter(torch.empty(d_model, d_head))
        self.W_V = nn.Parameter(torch.empty(d_model, d_head))
        if bias:
            self.b_Q = nn.Parameter(torch.zeros(d_head))
            self.b_K = nn.Parameter(torch.zeros(d_head))
            self.b_V = nn.Parameter(torch.zeros(d_head))


class Attention(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.scale = attention_scale(cfg)
        self.impl = "auto"
        self.use_attn_result = False  # set True to fill hook_result [batch pos head d_model]
        self.heads = nn.ModuleList(
            [AttentionHead(cfg.d_model, cfg.d_head, cfg.attn_bias) for _ in range(cfg.n_heads)])
        if cfg.attn_out_proj:
            self.W_O = nn.Parameter(torch.empty(cfg.d_attn, cfg.d_model))
            if cfg.has_out_bias:
                self.b_O = nn.Parameter(torch.zeros(cfg.d_model))
        self.hook_q = HookPoint()  # [batch pos head d_head]
        self.hook_k = HookPoint()  # [batch pos head d_head]
        self.hook_v = HookPoint()  # [batch pos head d_head]
        self.hook_attn_scores = HookPoint()  # [batch head q_pos k_pos], scaled and masked
        self.hook_pattern = HookPoint()  # [batch head q_pos k_pos]
        self.hook_z = HookPoint()  # [batch pos head d_head]
        self.hook_result = HookPoint()  # [batch pos head d_model]

    def stacked(self, name: str) -> torch.Tensor:
        """A per-head parameter stacked over heads: W_* -> [head d_model d_head], b_* -> [head d_head]."""
        return torch.stack([getattr(head, name) for head in self.heads])

    def project(self, x: torch.Tensor, which: str) -> torch.Tensor:
        out = torch.einsum("bpd,hde->bphe", x, self.stacked(f"W_{which}"))  # [batch pos head d_head]
        if self.cfg.attn_bias:
            out = out + self.stacked(f"b_{which}")
        return out

    def use_fused(self) -> bool:
        if self.impl == "explicit":
            return False
        hooked = is_hooked(self.hook_attn_scores) or is_hooked(self.hook_pattern)
        if self.impl == "fused" and hooked:
            raise RuntimeError("attention impl 'fused' cannot feed hooks on scores or pattern")
        return not hooked

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [batch pos d_model]
        q = self.hook_q(self.project(x, "Q"))
        k = self.hook_k(self.project(x, "K"))
        v = self.hook_v(self.project(x, "V"))
        z = self.fused(q, k, v) if self.use_fused() else self.explicit(q, k, v)
        z = self.hook_z(z)  # [batch pos head d_head]
        return self.output(z)

    def explicit(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        n = q.shape[1]
        # scale q, not the [b h q k] scores, and mask in place: one full-size tensor, not three
        scores = torch.einsum("bqhe,bkhe->bhqk", q / self.scale, k)
        hidden = torch.ones(n, n, dtype=torch.bool, device=q.device).triu_(1)  # [q_pos k_pos]
        scores = self.hook_attn_scores(scores.masked_fill_(hidden, float("-inf")))
        pattern = self.hook_pattern(scores.softmax(dim=-1))
        pattern = F.dropout(pattern, self.cfg.dropout, self.training)
        return torch.einsum("bhqk,bkhe->bqhe", pattern, v)

    def fused(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [batch head pos d_head]
        z = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.cfg.dropout if self.training else 0.0,
            scale=1.0 / self.scale)
        # SDPA's CPU kernel turns NaN scores into zero output, hiding a diverged head that the
        # explicit path shows as NaN; x * 0 is NaN exactly when x is, so this re-poisons
        # the affected (batch, head) without a host sync.
        # (summed in fp32: an fp16 sum of healthy activations can overflow to inf)
        nan_guard = (q.float().sum(dim=(2, 3)) + k.float().sum(dim=(2, 3))) * 0  # [batch head]
        return (z + nan_guard[..., None, None].to(z.dtype)).transpose(1, 2)  # [batch pos head d_head]

    def output(self, z: torch.Tensor) -> torch.Tensor:
        batch, pos = z.shape[:2]
        if self.use_attn_result:
            result = self.hook_result(torch.einsum("bphe,hed->bphd", z, self.per_head_W_O()))
            out = result.sum(dim=2)  # [batch pos d_model]
        elif self.cfg.attn_out_proj:
            out = z.reshape(batch, pos, self.cfg.d_attn) @ self.W_O
        else:
            return z.reshape(batch, pos, self.cfg.d_attn)  # the series' single head: no W_O
        if self.cfg.has_out_bias:
            out = out + self.b_O
        return out  # [batch pos d_model]

    def per_head_W_O(self) -> torch.Tensor:
        """W_O split by head: [head d_head d_model]; without W_O, each head writes its own slice."""
        cfg = self.cfg
        W_O = self.W_O if cfg.attn_out_proj else torch.eye(
            cfg.d_attn, dtype=self.heads[0].W_Q.dtype, device=self.heads[0].W_Q.device)
        return W_O.view(cfg.n_heads, cfg.d_head, -1)
