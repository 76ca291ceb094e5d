"""nanoGPT's model as its model.py publishes it (karpathy/nanoGPT), cut to what a forward needs,
and its train.py's way of saving: the reference the nanoGPT loader is tested against."""

from __future__ import annotations

import math
import pickle
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class GPTConfig:
    block_size: int = 16
    vocab_size: int = 65
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 32
    dropout: float = 0.0
    bias: bool = True


class LayerNorm(nn.Module):
    def __init__(self, ndim: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.n_head, self.n_embd = config.n_head, config.n_embd

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))  # nanoGPT's slow path
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool, device=att.device).triu(1), float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1, self.attn = LayerNorm(config.n_embd, config.bias), CausalSelfAttention(config)
        self.ln_2, self.mlp = LayerNorm(config.n_embd, config.bias), MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, config.bias)))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        with torch.no_grad():  # random weights everywhere, LayerNorms included, so every map shows
            for p in self.parameters():
                p.copy_(torch.randn_like(p) * 0.3)

    def forward(self, idx):  # [batch pos] -> logits [batch pos vocab] (as when given targets)
        t = idx.size(1)
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(t, device=idx.device))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def init_like_nanogpt(model: GPT) -> GPT:
    """nanoGPT's own init (its _init_weights and the c_proj rescaling), for training from scratch:
    N(0, 0.02) weights, zero biases, unit LayerNorms, residual projections N(0, 0.02/sqrt(2 n_layer))."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif ".ln_" in name:
                p.fill_(1.0)
            else:
                std = 0.02 / math.sqrt(2 * model.config.n_layer) if name.endswith("c_proj.weight") else 0.02
                p.normal_(0.0, std)
    return model


def save_like_nanogpt(model: nn.Module, path: Path, iter_num: int = 250, dataset: str = "shakespeare_char") -> None:
    """train.py's checkpoint dict, written with torch.save as it does (model may be compiled)."""
    raw = getattr(model, "_orig_mod", model)
    optimizer = torch.optim.AdamW(raw.parameters(), lr=1e-3)
    config = {"out_dir": str(path.parent), "dataset": dataset, "batch_size": 12, "learning_rate": 1e-3,
              "compile": model is not raw, "eval_only": False, "dtype": "float32"}
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "model_args": asdict(raw.config), "iter_num": iter_num,
                "best_val_loss": torch.tensor(1.4697), "config": config}, path)


def write_meta_pkl(path: Path, chars: str) -> None:
    """data/<dataset>/prepare.py's meta.pkl."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)),
                     "stoi": {c: i for i, c in enumerate(chars)}}, f)
