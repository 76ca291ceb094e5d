"""Named presets: every model of the series, the blog feed's GPTs, and a CPU-sized twin of each.

`get_preset(name, **overrides)` returns a validated config; `PRESETS[name].train` holds the
training hyperparameters the source used (optimizer, lr, batch size, context), for
`train` and for the record. The `_small` twins keep every architectural switch and shrink
only widths, context and vocabulary so they build and run in milliseconds on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from models.config import MLPConfig, ModelConfig, TransformerConfig

SERIES_SGD = {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": True, "batch_size": 4096}


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    config: ModelConfig
    train: dict[str, Any] = field(default_factory=dict)


def _series_attention(**changes: Any) -> TransformerConfig:
    """The series' attention posts: vocab 2048 BPE, ctx 32, d 256, MLP hidden 8*d, depth 2."""
    base = dict(d_vocab=2048, n_ctx=32, d_model=256, n_layers=1, n_heads=1, d_head=256,
                d_mlp=2048, mlp_depth=2, act_fn="relu", attn_scale="sqrt_d_model")
    return TransformerConfig(**{**base, **changes})


_NO_RESIDUAL = dict(residual=False, unembed="mlp", attn_out_proj=False)

_FULL: list[Preset] = [
    Preset("char_mlp", "series: character MLP, 10 chars x 64-d embeddings, one hidden layer of 640",
           MLPConfig(d_vocab=65, n_ctx=10, d_embed=64, d_hidden=640, n_hidden_layers=1),
           {"optimizer": "sgd", "lr": 0.01, "momentum": 0.9, "batch_size": 1024}),
    Preset("token_mlp", "series: tokenized MLP, 32 BPE tokens x 256-d, 3 hidden layers of 8256",
           MLPConfig(d_vocab=2048, n_ctx=32, d_embed=256, d_hidden=32 * 256 + 64, n_hidden_layers=3),
           {"optimizer": "sgd", "lr": 0.01, "momentum": 0.9, "batch_size": 4096}),
    Preset("attn1_noscale", "series: single-head attention, no sqrt(d) scaling (collapses to one-hot)",
           _series_attention(attn_scale="none", init="series_unscaled", **_NO_RESIDUAL), SERIES_SGD),
    Preset("attn1_sqrtd", "series: single-head attention with sqrt(d) scaling",
           _series_attention(**_NO_RESIDUAL), SERIES_SGD),
    Preset("attn1_residual", "series: single-head attention, sqrt(d) scaling and residuals",
           _series_attention(attn_out_proj=False), SERIES_SGD),
    Preset("mha4_fullrank", "series: 4 heads, each full-rank (d_head = d = 256)",
           _series_attention(n_heads=4, d_head=256), SERIES_SGD),
    Preset("mha4", "series: 4 heads with d_head = d / h = 64",
           _series_attention(n_heads=4, d_head=64), SERIES_SGD),
    Preset("transformer2", "series: 2 blocks, 4 heads, no normalization",
           _series_attention(n_layers=2, n_heads=4, d_head=64), SERIES_SGD),
    Preset("transformer4", "series: 4 blocks without normalization (goes NaN)",
           _series_attention(n_layers=4, n_heads=4, d_head=64), SERIES_SGD),
    Preset("transformer4_rms", "series: 4 blocks with pre-RMSNorm (val ppl 48.99 with SGD)",
           _series_attention(n_layers=4, n_heads=4, d_head=64, norm="rms"), SERIES_SGD),
    Preset("tiny_shakespeare_gpt", "blog feed: char-level GPT, 4 layers, 6 heads, d 192, ctx 128",
           TransformerConfig(d_vocab=65, n_ctx=128, d_model=192, n_layers=4, n_heads=6, d_head=32,
                             d_mlp=768, act_fn="relu", attn_scale="sqrt_d_head", norm="layer",
                             norm_eps=1e-5, final_norm=True, attn_out_bias=True,
                             unembed_bias=True, dropout=0.2, init="gpt"),
           {"optimizer": "adamw", "lr": 3e-4, "batch_size": 64}),
    Preset("gpt2_124m", "blog feed: GPT-2 124M (12 layers, 12 heads, d 768, ctx 1024, tied)",
           TransformerConfig(d_vocab=50304, n_ctx=1024, d_model=768, n_layers=12, n_heads=12,
                             d_head=64, d_mlp=3072, act_fn="gelu", attn_scale="sqrt_d_head",
                             norm="layer", norm_eps=1e-5, final_norm=True, attn_bias=True,
                             unembed="tied", init="gpt2"),
           {"optimizer": "adamw", "lr": 6e-4, "betas": (0.9, 0.95), "weight_decay": 0.1,
            "batch_size": 524288 // 1024, "warmup_steps": 715, "grad_clip": 1.0}),
]


def _small(preset: Preset) -> Preset:
    """Same switches, CPU-sized: d 32, ctx <= 16, vocab <= 96, MLP hidden 64, at most 4 layers."""
    cfg = preset.config
    vocab = min(cfg.d_vocab, 96)
    if isinstance(cfg, MLPConfig):
        small: ModelConfig = cfg.replace(d_vocab=vocab, n_ctx=min(cfg.n_ctx, 8), d_embed=8,
                                         d_hidden=64)
    else:
        n_heads = min(cfg.n_heads, 4)
        d_head = 32 if cfg.d_head == cfg.d_model else 32 // n_heads
        small = cfg.replace(d_vocab=vocab, n_ctx=16, d_model=32, n_heads=n_heads, d_head=d_head,
                            d_mlp=64, n_layers=cfg.n_layers if cfg.n_layers <= 4 else 2)
    train = {**preset.train, "batch_size": 32}
    return Preset(preset.name + "_small", f"CPU-sized twin of {preset.name}", small, train)


PRESETS: dict[str, Preset] = {p.name: p for p in _FULL + [_small(p) for p in _FULL]}


def list_presets() -> list[str]:
    return list(PRESETS)


def get_preset(name: str, **overrides: Any) -> ModelConfig:
    """The preset's config with fields overridden (e.g. d_vocab to match a tokenizer)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
    config = PRESETS[name].config
    return config.replace(**overrides) if overrides else config
