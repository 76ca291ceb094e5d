"""A plain nanoGPT-style module of one of our transformer configs, and how many ops one forward
runs: what `benchmarks/bench_model.py` times ours against and `tests/test_model_ops.py` counts.

The plain module: one `c_attn` Linear for q, k and v, `scaled_dot_product_attention`,
`nn.LayerNorm`, a `Sequential` MLP, no hook points, no checks. `copy_weights` gives it our
weights (the same function: the same logits).

`op_counts` of one forward (or forward and backward), two counts, both deterministic (no timing):
- "profiler": every `aten::` event torch.profiler records (nested calls included), the op count
  the profiler shows;
- "kernels": the ops dispatched below autograd (a TorchDispatchMode) that compute something,
  views and other metadata-only ops left out: on a GPU each is a kernel launch (a `_foreach_*`
  op counts once: one multi-tensor launch on dense inputs).
"""

from __future__ import annotations

from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

# not views by their schema, yet no kernel runs: they relabel a shape or only allocate
METADATA_OPS = {"aten._unsafe_view", "aten._reshape_alias", "aten.lift_fresh", "aten.empty", "aten.empty_like",
                "aten.empty_strided"}


class PlainBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, bias = cfg.d_model, cfg.attn_bias
        self.n_heads, self.scale = cfg.n_heads, cfg.d_head ** -0.5
        self.ln_1 = nn.LayerNorm(d, eps=cfg.norm_eps)
        self.c_attn = nn.Linear(d, 3 * cfg.d_attn, bias=bias)
        self.c_proj = nn.Linear(cfg.d_attn, d, bias=cfg.has_out_bias)
        self.ln_2 = nn.LayerNorm(d, eps=cfg.norm_eps)
        act = nn.GELU() if cfg.act_fn == "gelu" else nn.ReLU()
        self.mlp = nn.Sequential(nn.Linear(d, cfg.d_mlp, bias=cfg.mlp_bias), act,
                                 nn.Linear(cfg.d_mlp, d, bias=cfg.mlp_bias))

    def forward(self, x):  # [batch pos d_model]
        b, p, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(self.c_proj.in_features, dim=2)
        q, k, v = (t.view(b, p, self.n_heads, -1).transpose(1, 2) for t in (q, k, v))
        z = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        x = x + self.c_proj(z.transpose(1, 2).reshape(b, p, -1))
        return x + self.mlp(self.ln_2(x))


class PlainGPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.wte = nn.Embedding(cfg.d_vocab, cfg.d_model)
        self.wpe = nn.Parameter(torch.zeros(cfg.n_ctx, cfg.d_model))
        self.blocks = nn.ModuleList(PlainBlock(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.d_vocab, bias=cfg.unembed_bias)
        if cfg.unembed == "tied":
            self.lm_head.weight = self.wte.weight

    def forward(self, tokens):  # [batch pos] -> [batch pos d_vocab]
        x = self.wte(tokens) + self.wpe[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


@torch.no_grad()
def copy_weights(ours, plain: PlainGPT) -> None:
    """Our parameters into the plain module (the same function, so the same logits)."""
    cfg = ours.cfg
    plain.wte.weight.copy_(ours.embedding.weight)
    plain.wpe.copy_(ours.W_pos)
    for mine, theirs in zip(ours.blocks, plain.blocks):
        att = mine.attention
        for which, part in zip("QKV", theirs.c_attn.weight.split(cfg.d_attn)):
            part.copy_(torch.cat([getattr(h, f"W_{which}") for h in att.heads], dim=1).T)
        if cfg.attn_bias:
            for which, part in zip("QKV", theirs.c_attn.bias.split(cfg.d_attn)):
                part.copy_(torch.cat([getattr(h, f"b_{which}") for h in att.heads]))
        theirs.c_proj.weight.copy_(att.W_O.T)
        if cfg.has_out_bias:
            theirs.c_proj.bias.copy_(att.b_O)
        for ln, ln_ours in ((theirs.ln_1, mine.ln1), (theirs.ln_2, mine.ln2)):
            ln.weight.copy_(ln_ours.gamma)
            ln.bias.copy_(ln_ours.beta)
        for layer, layer_ours in zip(theirs.mlp[::2], mine.mlp.net[::2]):
            layer.weight.copy_(layer_ours.weight)
            if layer.bias is not None:
                layer.bias.copy_(layer_ours.bias)
    plain.ln_f.weight.copy_(ours.ln_final.gamma)
    plain.ln_f.bias.copy_(ours.ln_final.beta)
    if cfg.unembed == "separate":
        plain.lm_head.weight.copy_(ours.W_out.T)
    if cfg.unembed_bias:
        plain.lm_head.bias.copy_(ours.b_out)

class KernelOps(TorchDispatchMode):
    """Counts the ops dispatched below autograd that compute (not views), by name."""

    def __init__(self):
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name().split(".")[0].replace("::", ".")
        if not func.is_view and name not in METADATA_OPS:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def op_counts(model: nn.Module, tokens: torch.Tensor, grad: bool, backward: bool = False) -> dict[str, int]:
    """The ops of one forward of `model` on `tokens` [batch pos] with gradients off or on (a
    training step's forward), or with `backward` of a training step (forward, cross-entropy on the
    tokens themselves, backward), after one untimed run: {"profiler": ..., "kernels": ...}."""
    def run() -> None:
        logits = model(tokens)  # [batch pos d_vocab]
        if backward:
            F.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
            model.zero_grad(set_to_none=True)

    with torch.set_grad_enabled(grad or backward):
        run()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run()
        with KernelOps() as kernels:
            run()
    return {"profiler": sum(e.name.startswith("aten::") for e in prof.events()),
            "kernels": sum(kernels.ops.values())}
