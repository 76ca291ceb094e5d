"""The `transformer` family: the series' attention nets and GPT-style models on one skeleton.

Read top to bottom: Block (attention + MLP, residual and norm switches), Transformer (embedding,
blocks, final norm, unembedding). Parameter names are the series' (`embedding.weight`, `W_pos`,
`W_out`, `blocks.{i}.attention.heads.{j}.W_Q`, `blocks.{i}.mlp.net.0.weight`,
`blocks.{i}.rms1.gamma`); hook names are TransformerLens' (`blocks.{i}.ln1.hook_scale`, ...).

With nothing hooked, hook points are skipped, so `torch.compile(model)` traces one graph. Dynamo
by default does not guard on module hook dicts (`torch._dynamo.config.skip_nnmodule_hook_guards`):
a hook added after compiling is seen by the eager `model` but not by the compiled callable unless
that flag is set to False (then adding or removing a hook recompiles).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from models.attention import ATTN_IMPLS, Attention, guard_per_call
from models.cache import BlockTLNames, TLWeights
from models.config import TransformerConfig
from models.hooks import fire, passthrough, rename_hooks_to_tl, unobserved
from models.layers import MLP, affine, make_norm, norm_attr, shrink_
from models.packed_heads import named_rows
from models.validation import check_tokens, vocabulary_error


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """`F.dropout`, skipped outright when it would be the identity (no op call per forward)."""
    return F.dropout(x, p, True) if training and p else x


class Block(BlockTLNames, nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.attention = Attention(cfg)
        d_out = cfg.d_vocab if cfg.unembed == "mlp" else cfg.d_model
        d_in = cfg.d_model if cfg.attn_out_proj else cfg.d_attn
        self.mlp = MLP(d_in, cfg.d_mlp, d_out, cfg.mlp_depth, cfg.act_fn, cfg.mlp_bias)
        if cfg.norm != "none":
            setattr(self, norm_attr(cfg.norm, 1), make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.norm_bias))
            setattr(self, norm_attr(cfg.norm, 2), make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.norm_bias))
        self._norm_names = {i: norm_attr(cfg.norm, i) for i in (1, 2)}
        self.hook_resid_pre = HookPoint()  # [batch pos d_model]
        self.hook_attn_out = HookPoint()  # [batch pos d_model]
        self.hook_resid_mid = HookPoint()  # [batch pos d_model]
        self.hook_mlp_out = HookPoint()  # [batch pos d_model], d_vocab when unembed="mlp"
        self.hook_resid_post = HookPoint()  # [batch pos d_model], d_vocab when unembed="mlp"

    def norm(self, index: int, x: torch.Tensor, placement: str, plain: bool = False) -> torch.Tensor:
        if self.cfg.norm == "none" or self.cfg.norm_placement != placement:
            return x
        return self._modules[self._norm_names[index]](x, plain)

    def dropout(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.cfg.dropout, self.training)

    def forward(self, x: torch.Tensor, plain: bool = False) -> torch.Tensor:
        # x: [batch pos d_model]; submodules read from _modules (nn.Module.__getattr__ costs ~1 us).
        # plain: the model found nothing hooked (`models.hooks.unobserved`): no hook point to ask
        m, residual, see = self._modules, self.cfg.residual, passthrough if plain else fire
        x = see(m["hook_resid_pre"], x)
        attn_out = see(m["hook_attn_out"], self.dropout(m["attention"](self.norm(1, x, "pre", plain), plain)))
        x = x + attn_out if residual else attn_out
        x = see(m["hook_resid_mid"], self.norm(1, x, "post", plain))
        mlp_out = see(m["hook_mlp_out"], self.dropout(m["mlp"](self.norm(2, x, "pre", plain), plain)))
        x = x + mlp_out if residual else mlp_out
        return see(m["hook_resid_post"], self.norm(2, x, "post", plain))


class Transformer(TLWeights, HookedRootModule):
    """tokens [batch pos] -> logits [batch pos d_vocab]."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.embedding = nn.Embedding(cfg.d_vocab, cfg.d_model)
        if cfg.pos_embed == "learned":
            self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model))
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layers)])
        if cfg.final_norm:
            self.ln_final = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.norm_bias)
        if cfg.unembed == "separate":
            self.W_out = nn.Parameter(torch.empty(cfg.d_model, cfg.d_vocab))
        if cfg.unembed_bias:
            self.b_out = nn.Parameter(torch.zeros(cfg.d_vocab))
        self.hook_embed = HookPoint()  # [batch pos d_model]
        self.hook_pos_embed = HookPoint()  # [batch pos d_model]
        self._logits_guard: tuple | None = None  # (weights' key, guard) for forwards without gradients
        init_weights(self)
        self.register_load_state_dict_pre_hook(_rename_series_attnnet_keys)
        self.setup()

    def setup(self) -> None:
        """TransformerLens setup, then TL hook names (attention -> attn, rms1 -> ln1)."""
        super().setup()
        rename_hooks_to_tl(self)

    @property
    def W_U(self) -> torch.Tensor:
        """Unembedding [d_model d_vocab] (the embedding transposed when tied)."""
        if self.cfg.unembed == "separate":
            return self.W_out
        if self.cfg.unembed == "tied":
            return self.embedding.weight.T
        raise ValueError("this model has no unembedding matrix: its last MLP maps to the vocabulary")

    @property
    def b_U(self) -> torch.Tensor | None:
        """Unembedding bias [d_vocab], or None (the series and GPT-2 have none)."""
        return self.b_out if self.cfg.unembed_bias else None

    def series_parameters(self) -> dict[str, torch.Tensor]:
        """Trainable parameters by the series' names, in its order: each head's W_Q/W_K/W_V (and
        biases) as a view of its layer's packed `W_QKV` (`models.packed_heads`), where
        `named_parameters()` lists the packed parameter itself."""
        return named_rows(self)

    def set_attn_impl(self, impl: str) -> None:
        """'auto' (fused unless scores/pattern are hooked), 'explicit' or 'fused'."""
        if impl not in ATTN_IMPLS:
            raise ValueError(f"attention impl must be one of {ATTN_IMPLS}, got {impl!r}")
        for block in self.blocks:
            block.attention.impl = impl

    def set_use_attn_result(self, on: bool) -> None:
        for block in self.blocks:
            block.attention.use_attn_result = on

    def embed(self, tokens: torch.Tensor, plain: bool = False) -> torch.Tensor:
        see = passthrough if plain else fire
        try:
            x = self.embedding(tokens)  # [batch pos d_model]
        except IndexError:  # an id outside the vocabulary (CPU; on CUDA a device-side assert)
            error = vocabulary_error(tokens, self.cfg.d_vocab)
            if error is None:
                raise
            raise error from None
        x = see(self.hook_embed, x)
        if self.cfg.pos_embed == "learned":
            x = x + see(self.hook_pos_embed, self.W_pos[: tokens.shape[1]].expand_as(x))
        return dropout(x, self.cfg.dropout, self.training)

    def unembed(self, x: torch.Tensor, plain: bool = False) -> torch.Tensor:
        if self.cfg.final_norm:
            x = self.ln_final(x, plain)
        if self.cfg.unembed == "mlp":
            return x  # the last MLP already produced [batch pos d_vocab]
        if self.cfg.unembed == "tied":  # the embedding [d_vocab d_model] is linear's own layout
            return F.linear(x, self.embedding.weight, self.b_U)  # [batch pos d_vocab]
        return affine(x, self.W_out, self.b_U)  # [batch pos d_vocab]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # ids outside the vocabulary: the embedding lookup raises, `embed` names the id
        tokens = check_tokens(tokens, self.cfg.d_vocab, self.cfg.n_ctx, check_range=False)  # [batch pos]
        # one decision per forward: with nothing hooked, no layer asks its hook points, and the
        # q/k weights of every layer are guarded at once, on the logits (no one sees between)
        plain = unobserved(self)
        x = self.embed(tokens, plain)
        for block in self.blocks:
            x = block(x, plain)
        logits = self.unembed(x, plain)  # [batch pos d_vocab]
        return logits + self.logits_guard() if plain and self.blocks else logits

    def logits_guard(self) -> torch.Tensor:
        """`qk_weights_guard`: computed afresh with gradients on (the weights change every step),
        else kept while every layer's q/k weights sit in the same memory at the same version."""
        if guard_per_call(self.blocks[0].attention.W_QKV):
            return qk_weights_guard(self)
        key = tuple((w.data_ptr(), w._version) for block in self.blocks for w in block.attention.qk_weights()
                    if w is not None)
        if self._logits_guard is None or self._logits_guard[0] != key:
            self._logits_guard = (key, qk_weights_guard(self))
        return self._logits_guard[1]


@functools.lru_cache(maxsize=16)
def constant_row(value: float, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[n] filled with `value`, made once per (value, size, dtype, device): read every step."""
    return torch.full((n,), value, dtype=dtype, device=device)


@torch.no_grad()
def qk_weights_guard(model: Transformer) -> torch.Tensor:
    """[] 0, or NaN when a q/k weight or bias of any layer is NaN or inf: a diverged head, which
    SDPA may hide (`Attention.weight_guard` is one layer's, per head). Each layer's q/k column
    sums plus its q/k biases come from one matmul (a row of ones times W, plus b) into a row of
    a buffer, whose dot with zeros is 0, or NaN where a sum is inf or NaN (0 * inf): a launch per
    layer and two in all, where the guard per layer took four to six each. (In fp16 a column sum
    past 65504 would read as inf: d_model weights of mean |w| > 85, no healthy model's.)"""
    layers = [block.attention.qk_weights() for block in model.blocks]  # [(W [d_model 2*d_attn], b [2*d_attn] | None)]
    W = layers[0][0]
    ones = constant_row(1.0, W.shape[0], W.dtype, W.device).view(1, -1)  # [1 d_model]
    sums = torch.empty(len(layers), 1, W.shape[1], dtype=W.dtype, device=W.device)  # [layer 1 2*d_attn]
    for (W, b), row in zip(layers, sums.unbind()):
        torch.mm(ones, W, out=row) if b is None else torch.addmm(b, ones, W, out=row)
    return torch.dot(sums.view(-1), constant_row(0.0, sums.numel(), W.dtype, W.device))


def init_weights(model: Transformer) -> None:
    """Series init (N(0,1) embeddings, W_Q/K/V / sqrt(d)), GPT init (all 0.02, as nanoGPT's
    Tiny Shakespeare model) or GPT-2 init (0.02, residual projections / sqrt(2 n_layers))."""
    cfg = model.cfg
    gpt_like = cfg.init in ("gpt", "gpt2")
    resid_std = 0.02 / math.sqrt(2 * cfg.n_layers) if cfg.init == "gpt2" else 0.02
    with torch.no_grad():
        if gpt_like:
            nn.init.normal_(model.embedding.weight, std=0.02)
        if cfg.pos_embed == "learned":
            nn.init.normal_(model.W_pos, std=0.02 if gpt_like else 1.0)
        if cfg.unembed == "separate":
            nn.init.normal_(model.W_out, std=0.02 if gpt_like else 1 / math.sqrt(cfg.d_model))
        qkv_std = {"series": 1 / math.sqrt(cfg.d_model), "series_unscaled": 1.0}.get(cfg.init, 0.02)
        for block in model.blocks:
            for head in block.attention.heads:
                for W in (head.W_Q, head.W_K, head.W_V):
                    nn.init.normal_(W, std=qkv_std)
            if cfg.attn_out_proj:
                # the series: randn(d*h, d)/sqrt(d) for full-rank heads, /sqrt(d_k*h) for d_k = d/h
                fan_in = cfg.d_model if cfg.d_head == cfg.d_model else cfg.d_attn
                nn.init.normal_(block.attention.W_O, std=resid_std if gpt_like else 1 / math.sqrt(fan_in))
            if gpt_like:
                for i, layer in enumerate(block.mlp.net):
                    if isinstance(layer, nn.Linear):
                        last = i == len(block.mlp.net) - 1
                        nn.init.normal_(layer.weight, std=resid_std if last else 0.02)
                        if layer.bias is not None:
                            nn.init.zeros_(layer.bias)
        if cfg.unembed_init_scale != 1.0:
            scale_logit_layer(model, cfg.unembed_init_scale)


def scale_logit_layer(model: Transformer, scale: float) -> None:
    """W_out (or, with unembed='mlp', the last MLP layer) times `scale`, its bias zero: logits
    that many times smaller at init."""
    if model.cfg.unembed == "separate":
        shrink_(model.W_out, model.b_out if model.cfg.unembed_bias else None, scale)
    else:
        last = model.blocks[-1].mlp.net[-1]
        shrink_(last.weight, last.bias, scale)


def series_key(key: str) -> str:
    """Our name for a series parameter name: the single-block AttnNet's `attention.W_Q` becomes
    `blocks.0.attention.heads.0.W_Q` and its `mlp.net.0.weight` `blocks.0.mlp.net.0.weight`;
    the multi-block Transformer's names are already ours and come back unchanged."""
    if key.startswith("attention.W_") and key[-1] in "QKV":
        return f"blocks.0.attention.heads.0.{key.split('.')[-1]}"
    if key.startswith(("attention.", "mlp.")):
        return f"blocks.0.{key}"
    return key


def _rename_series_attnnet_keys(module, state_dict, prefix, *_args) -> None:
    """load_state_dict pre-hook: accept the series' single-block AttnNet names."""
    for key in list(state_dict):
        if key.startswith(prefix):
            ours = prefix + series_key(key[len(prefix):])
            if ours != key:
                state_dict[ours] = state_dict.pop(key)
