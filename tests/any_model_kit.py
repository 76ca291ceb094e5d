"""Tiny models that are not ours, each able to hand back its own attention patterns: the reference
the attention tap (`models.tap`) is checked against. Written here in our own words, in the layouts
people use (tutorial GPTs, Hugging Face Llama / Qwen2, nanochat); all CPU-fast, nothing downloaded.

- `PerHeadGPT`: one module per head, a softmax over `[batch q k]` (an `nn.Softmax` submodule in
  layer 0, `torch.softmax` after; W_query, W_key, W_value, out_proj, ff, norm1, tok_emb, pos_emb,
  out_head): the tutorial-book layout.
- `BatchedGPT`: one packed `qkv`, `F.softmax` over `[batch head q k]` (proj, ffwd, ln1,
  token_embedding_table): the video-tutorial layout.
- `SplitGPT`: separate `query`, `key`, `value` Linears, `F.softmax` over `[batch head q k]`, a tied
  unembedding (`wte`, `wpe`, `h`, `ln_f`, `lm_head`).
- `SdpaGPT`: packed `qkv` and `F.scaled_dot_product_attention(is_causal=True)`.
- `MhaGPT`: blocks on `nn.MultiheadAttention` (its SDPA path, or its softmax with need_weights).
- `ChatGPT`: nanochat's layout (c_q/c_k/c_v/c_proj, rotary, QK-norm, grouped kv heads, a sliding
  window as a boolean mask on some layers, relu², untied head, logit softcap).
- `nanochat_gpt(n_head, n_embd)`: nanochat's own GPT, small (window pattern "SL": its short window
  is 128 keys before the query at sequence_len 512); the test is skipped where nanochat does not import.
- `hf_pair("llama" | "qwen2")`: the same random weights as an SDPA model and an eager one; the
  eager one's `output_attentions=True` gives the reference patterns.

Every tutorial model keeps the patterns of its last forward in `model.patterns` ([batch head q k]
per layer) when built with `keep=True` (SdpaGPT and ChatGPT then take an explicit path that is
written apart from their SDPA call).
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


# ---------------------------------------------------------------- nanochat's layout

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


# ---------------------------------------------------------------- Hugging Face, in memory

def hf_config(kind: str, attn_implementation: str):
    common = dict(vocab_size=VOCAB, hidden_size=D, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  attn_implementation=attn_implementation)
    if kind == "llama":
        from transformers import LlamaConfig
        return LlamaConfig(**common)
    if kind == "qwen2":
        from transformers import Qwen2Config
        return Qwen2Config(**common)
    raise ValueError(f"unknown kind {kind!r}: llama or qwen2")


def hf_model(kind: str, attn_implementation: str = "sdpa", seed: int = 0):
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM
    torch.manual_seed(seed)
    cls = LlamaForCausalLM if kind == "llama" else Qwen2ForCausalLM
    model = cls(hf_config(kind, attn_implementation)).eval()
    with torch.no_grad():  # random norm gains, so a reading that skips them differs
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
    return model


def hf_pair(kind: str, seed: int = 0):
    """(SDPA model, eager model) with the same weights."""
    sdpa = hf_model(kind, "sdpa", seed)
    eager = hf_model(kind, "eager", seed)
    eager.load_state_dict(sdpa.state_dict())
    return sdpa, eager


def hf_patterns(eager, ids: torch.Tensor) -> list[torch.Tensor]:
    """Hugging Face's own eager patterns: [batch head q k] per layer."""
    with torch.no_grad():
        return [a.detach() for a in eager(ids, output_attentions=True).attentions]


def own_patterns(model: nn.Module, ids: torch.Tensor) -> list[torch.Tensor]:
    """A tutorial / nanochat-layout model's own patterns on ids, its SDPA models switched to their
    explicit path for the call only."""
    was = getattr(model, "explicit", None)
    with torch.no_grad():
        if isinstance(model, BatchedGPT):
            model.set_explicit(True)
        if isinstance(model, ChatGPT):
            model.keep = True
        if isinstance(model, MhaGPT):
            model.need_weights, was = True, model.need_weights
        try:
            model(ids)
            return [p.clone() for p in model.patterns]
        finally:
            if isinstance(model, BatchedGPT):
                model.set_explicit(bool(was))
            if isinstance(model, ChatGPT):
                model.keep = False
            if isinstance(model, MhaGPT):
                model.need_weights = was
