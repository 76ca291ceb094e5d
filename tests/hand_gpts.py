"""Two GPTs as a newcomer writes them by hand, in layouts none of our name lists were written for,
and a short Monitor run of either: what the app's charts, the g/w/u grouping and the doctor are
checked on (tests/test_hand_gpt_runs.py).

- `HandLlama`: rotary positions, its own RMSNorm, a SwiGLU MLP, one fused `wqkv` Linear,
  `F.scaled_dot_product_attention(is_causal=True)`, input and output embeddings tied, the context
  in `max_seq_len` (`tok`, `layers.N.attn.wqkv|wo`, `layers.N.mlp.gate|up|down`, `norm_f`, `lm`).
- `EinsumGPT`: scores by `torch.einsum`, `masked_fill(-inf)` on a causal buffer, `softmax(-1)`,
  blocks under `layers`, embeddings in a ModuleDict `emb.tok` / `emb.where`, separate
  `to_q` / `to_k` / `to_v`, `layers.N.ff` a Sequential with `nn.GELU` at `ff.1` (or, with
  `gelu_module=False`, two Linears and `F.gelu` called between them), a final norm `final`, an
  output `out`; forward returns the logits only.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, WIDTH, HEADS, CONTEXT = 12, 16, 2, 16
TEXT = "abcabdacbadcbaabcdab" * 8  # 160 characters over 4 letters


class OwnRMSNorm(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return self.gain * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def rotary(x: torch.Tensor) -> torch.Tensor:
    """Rotary positions on [batch head pos d_head], the two halves as the pairs."""
    n, d = x.shape[-2], x.shape[-1]
    freq = 1.0 / 10000 ** (torch.arange(0, d, 2, device=x.device).float() / d)
    angle = torch.arange(n, device=x.device).float()[:, None] * freq  # [pos d_head/2]
    a, b = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()], -1)


class LlamaAttention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.wqkv = nn.Linear(d, 3 * d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)

    def forward(self, x):  # [batch pos d]
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.heads, -1).transpose(1, 2) for t in self.wqkv(x).chunk(3, -1))
        y = F.scaled_dot_product_attention(rotary(q), rotary(k), v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, n, d))


class SwiGLU(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(d, 2 * d, bias=False), nn.Linear(d, 2 * d, bias=False), \
            nn.Linear(2 * d, d, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class LlamaBlock(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.pre_attn, self.pre_mlp = OwnRMSNorm(d), OwnRMSNorm(d)
        self.attn, self.mlp = LlamaAttention(d, heads), SwiGLU(d)

    def forward(self, x):
        x = x + self.attn(self.pre_attn(x))
        return x + self.mlp(self.pre_mlp(x))


class HandLlama(nn.Module):
    def __init__(self, vocab: int = VOCAB, d: int = WIDTH, heads: int = HEADS, layers: int = 2,
                 max_seq_len: int = CONTEXT):
        super().__init__()
        self.max_seq_len = max_seq_len
        self.tok = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(LlamaBlock(d, heads) for _ in range(layers))
        self.norm_f = OwnRMSNorm(d)
        self.lm = nn.Linear(d, vocab, bias=False)
        self.lm.weight = self.tok.weight  # tied

    def forward(self, ids):  # [batch pos] -> [batch pos vocab]
        x = self.tok(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm(self.norm_f(x))


class EinsumAttention(nn.Module):
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


class EinsumBlock(nn.Module):
    def __init__(self, d: int, heads: int, context: int, gelu_module: bool):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.mix = EinsumAttention(d, heads, context)
        self.gelu_module = gelu_module
        self.ff = (nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)) if gelu_module
                   else nn.Sequential(nn.Linear(d, 4 * d), nn.Linear(4 * d, d)))

    def forward(self, x):
        x = x + self.mix(self.n1(x))
        h = self.n2(x)
        return x + (self.ff(h) if self.gelu_module else self.ff[1](F.gelu(self.ff[0](h))))


class EinsumGPT(nn.Module):
    def __init__(self, vocab: int = VOCAB, d: int = WIDTH, heads: int = HEADS, layers: int = 2,
                 context: int = CONTEXT, gelu_module: bool = True):
        super().__init__()
        self.emb = nn.ModuleDict({"tok": nn.Embedding(vocab, d), "where": nn.Embedding(context, d)})
        self.layers = nn.ModuleList(EinsumBlock(d, heads, context, gelu_module) for _ in range(layers))
        self.final = nn.LayerNorm(d)
        self.out = nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.emb["tok"](ids) + self.emb["where"](torch.arange(ids.shape[1], device=ids.device))
        for layer in self.layers:
            x = layer(x)
        return self.out(self.final(x))


def text_ids(tokenizer, text: str = TEXT) -> torch.Tensor:
    return torch.tensor(tokenizer.encode(text))


def train_run(model: nn.Module, out: Path, steps: int = 6, lr: float = 3e-3, **monitor: object) -> Path:
    """`steps` AdamW steps on TEXT under the Monitor (log and eval every step), `monitor` its
    other settings (save_every, tokens_per_step, ...): the run directory."""
    from models.tokenizers import CharTokenizer
    from train.monitor import Monitor

    torch.manual_seed(0)
    tok = CharTokenizer.from_text(TEXT)
    ids = text_ids(tok)
    windows = ids[: 8 * CONTEXT].view(8, CONTEXT)  # [batch pos]
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    with Monitor(model, opt, out, log_every=1, eval_every=1, eval_tokens=windows[:2], steps=steps,
                 tokenizer=tok, report=False, **monitor) as mon:
        for step in range(steps):
            logits = model(windows[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            mon.log(step, train_loss=loss.item())
    return out


def run_json(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())
