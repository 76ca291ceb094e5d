"""What the tests of our models share (tests/test_models_*.py): the preset lists, hypothesis
settings, a seeded model in eval mode, random tokens, and the parameter count and hooks derived by
hand from a config (not from the code).
"""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, settings

from models import MLPConfig, TransformerConfig, build_model, get_preset, list_presets

ALL = list_presets()
FULL = [n for n in ALL if not n.endswith("_small")]
SMALL = [n for n in ALL if n.endswith("_small")]
SMALL_TF = [n for n in SMALL if isinstance(get_preset(n), TransformerConfig)]
SMALL_MLP = [n for n in SMALL if isinstance(get_preset(n), MLPConfig)]

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MODEL_PROPERTY = settings(max_examples=15, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])


def build(cfg_or_name, seed: int = 0, **overrides):
    """A model in eval mode (dropout off), deterministically initialised."""
    cfg = get_preset(cfg_or_name, **overrides) if isinstance(cfg_or_name, str) else cfg_or_name
    torch.manual_seed(seed)
    return build_model(cfg).eval()


def rand_tokens(cfg, batch: int = 2, pos: int | None = None, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.d_vocab, (batch, pos or cfg.n_ctx), generator=gen)


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def expected_params(cfg) -> int:
    """Parameter count derived by hand from the architecture (not from the code)."""
    if isinstance(cfg, MLPConfig):
        V, e, H, k = cfg.d_vocab, cfg.d_embed, cfg.d_hidden, cfg.n_hidden_layers
        return V * e + (cfg.n_ctx * e * H + H) + (k - 1) * (H * H + H) + (H * V + V)
    d, V, n, L = cfg.d_model, cfg.d_vocab, cfg.n_ctx, cfg.n_layers
    h, dh, dm, depth = cfg.n_heads, cfg.d_head, cfg.d_mlp, cfg.mlp_depth
    norm = {"none": 0, "rms": d, "layer": 2 * d}[cfg.norm]
    attn = 3 * h * d * dh + (3 * h * dh if cfg.attn_bias else 0)
    if cfg.attn_out_proj:
        attn += h * dh * d + (d if cfg.attn_bias or cfg.attn_out_bias else 0)
    d_out = V if cfg.unembed == "mlp" else d
    mlp = d * dm + (depth - 1) * dm * dm + dm * d_out
    if cfg.mlp_bias:
        mlp += depth * dm + d_out
    total = V * d + L * (attn + mlp + 2 * norm)
    total += n * d if cfg.pos_embed == "learned" else 0
    total += d * V if cfg.unembed == "separate" else 0
    total += V if cfg.unembed_bias else 0
    total += norm if cfg.final_norm else 0
    return total


def expected_hooks(cfg: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """Every hook that fires by default (hook_result needs set_use_attn_result), with shapes."""
    b, p, d, h, dh = 2, cfg.n_ctx, cfg.d_model, cfg.n_heads, cfg.d_head
    d_last = cfg.d_vocab if cfg.unembed == "mlp" else d
    shapes: dict[str, tuple[int, ...]] = {"hook_embed": (b, p, d)}
    if cfg.pos_embed == "learned":
        shapes["hook_pos_embed"] = (b, p, d)
    for l in range(cfg.n_layers):
        pre = f"blocks.{l}."
        shapes[pre + "hook_resid_pre"] = (b, p, d)
        for name in ("q", "k", "v", "z"):
            shapes[f"{pre}attn.hook_{name}"] = (b, p, h, dh)
        shapes[pre + "attn.hook_attn_scores"] = (b, h, p, p)
        shapes[pre + "attn.hook_pattern"] = (b, h, p, p)
        shapes[pre + "hook_attn_out"] = (b, p, d)
        shapes[pre + "hook_resid_mid"] = (b, p, d)
        for i in range(cfg.mlp_depth):
            suffix = "" if i == 0 else f"_{i}"
            shapes[f"{pre}mlp.hook_pre{suffix}"] = (b, p, cfg.d_mlp)
            shapes[f"{pre}mlp.hook_post{suffix}"] = (b, p, cfg.d_mlp)
        shapes[pre + "hook_mlp_out"] = (b, p, d_last)
        shapes[pre + "hook_resid_post"] = (b, p, d_last)
        if cfg.norm != "none":
            for ln in ("ln1", "ln2"):
                shapes[f"{pre}{ln}.hook_scale"] = (b, p, 1)
                shapes[f"{pre}{ln}.hook_normalized"] = (b, p, d)
    if cfg.final_norm:
        shapes["ln_final.hook_scale"] = (b, p, 1)
        shapes["ln_final.hook_normalized"] = (b, p, d)
    return shapes
