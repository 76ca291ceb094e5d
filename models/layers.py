"""Norms and the series' deep MLP, each with TransformerLens hook points.

Parameter names follow the series' code (`gamma`, `net.0.weight`, ...), so its state dicts load
unchanged; hook names follow TransformerLens (`hook_scale`, `hook_normalized`, `hook_pre`, ...).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from transformer_lens.hook_points import HookPoint

from models.hooks import fire, is_hooked, passthrough

ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh,
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),  # GPT-2's gelu_new, the same formula
}


class RMSNorm(nn.Module):
    """The series' RMSNorm: gamma * x / sqrt(mean(x^2) + eps), same operations in the same order."""

    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(d))
        self.hook_scale = HookPoint()  # [batch pos 1]
        self.hook_normalized = HookPoint()  # [batch pos d], before gamma as in TransformerLens

    def forward(self, x: torch.Tensor, plain: bool = False) -> torch.Tensor:
        # plain: the model found nothing hooked (`models.hooks.unobserved`): no hook point to ask
        see = passthrough if plain else fire
        rms = see(self.hook_scale, torch.sqrt(torch.mean(x ** 2, dim=-1, keepdim=True) + self.eps))
        return self.gamma * see(self.hook_normalized, x / rms)


class LayerNorm(nn.Module):
    """LayerNorm written out so its scale is observable, like TransformerLens' LayerNorm; without
    `bias` it has no beta (nanoGPT's bias=False)."""

    def __init__(self, d: int, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        self.eps = eps
        self.normalized_shape = (d,)
        self.gamma = nn.Parameter(torch.ones(d))
        self.beta = nn.Parameter(torch.zeros(d)) if bias else None
        self.hook_scale = HookPoint()  # [batch pos 1]
        self.hook_normalized = HookPoint()  # [batch pos d]

    def forward(self, x: torch.Tensor, plain: bool = False) -> torch.Tensor:
        m = self._modules
        if plain or not (is_hooked(m["hook_scale"]) or is_hooked(m["hook_normalized"])):
            # nobody looks inside: PyTorch's one fused kernel (the same function to ~1e-7)
            return torch.nn.functional.layer_norm(x, self.normalized_shape, self.gamma, self.beta, self.eps)
        x = x - x.mean(dim=-1, keepdim=True)
        scale = self.hook_scale(torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps))
        out = self.hook_normalized(x / scale) * self.gamma
        return out if self.beta is None else out + self.beta


def affine(x: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """x @ W + b for x [... d_in] and W [d_in d_out] (the series' layout) as one addmm over the
    flattened rows: W's gradient then comes out in W's own layout, where `F.linear(x, W.T, b)`
    hands back a transposed one that autograd copies before storing it."""
    rows = x.reshape(-1, x.shape[-1])  # [rows d_in]
    out = torch.mm(rows, W) if b is None else torch.addmm(b, rows, W)  # [rows d_out]
    return out.view(*x.shape[:-1], W.shape[-1])


def shrink_(weight: torch.Tensor, bias: torch.Tensor | None, scale: float) -> None:
    """The logit layer's init made `scale` times smaller, its bias zero (`unembed_init_scale`)."""
    with torch.no_grad():
        weight.mul_(scale)
        if bias is not None:
            bias.zero_()


def make_norm(kind: str, d: int, eps: float, bias: bool = True) -> nn.Module:
    if kind == "rms":
        return RMSNorm(d, eps)
    if kind == "layer":
        return LayerNorm(d, eps, bias)
    raise ValueError(f"no norm module for norm={kind!r}")


def norm_attr(kind: str, index: int) -> str:
    """Attribute name of a block's norm: the series calls its RMSNorms rms1/rms2."""
    return f"rms{index}" if kind == "rms" else f"ln{index}"


class MLP(nn.Module):
    """The series' MLP: `depth` x (Linear, activation), then a Linear to d_out, in `net`.

    Hidden layer 0 is observed by `hook_pre` / `hook_post`, hidden layer i >= 1 by
    `hook_pre_{i}` / `hook_post_{i}`.
    """

    def __init__(self, d_in: int, d_hidden: int, d_out: int, depth: int, act_fn: str = "relu",
                 bias: bool = True):
        super().__init__()
        layers: list[nn.Module] = []
        width = d_in
        for _ in range(depth):
            layers += [nn.Linear(width, d_hidden, bias=bias), ACTIVATIONS[act_fn]()]
            width = d_hidden
        layers.append(nn.Linear(width, d_out, bias=bias))
        self.net = nn.Sequential(*layers)
        self.depth = depth
        for i in range(depth):
            setattr(self, self.hook_name("pre", i), HookPoint())  # [batch pos d_hidden]
            setattr(self, self.hook_name("post", i), HookPoint())  # [batch pos d_hidden]
        # names resolved once: forward runs for every token batch, so no string work there
        self._layer_hooks = [(self.hook_name("pre", i), self.hook_name("post", i)) for i in range(depth)]

    @staticmethod
    def hook_name(kind: str, layer: int) -> str:
        return f"hook_{kind}" if layer == 0 else f"hook_{kind}_{layer}"

    def forward(self, x: torch.Tensor, plain: bool = False) -> torch.Tensor:
        # (Linear, activation) pairs then the output Linear, in order; iterating skips
        # Sequential's slow indexing
        layers, hooks, see = iter(self.net._modules.values()), self._modules, passthrough if plain else fire
        for pre, post in self._layer_hooks:
            x = see(hooks[pre], next(layers)(x))
            x = see(hooks[post], next(layers)(x))
        return next(layers)(x)

    @property
    def out_layer(self) -> nn.Linear:
        return self.net[-1]
