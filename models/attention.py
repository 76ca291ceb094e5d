"""Causal multi-head attention under the series' per-head parameter names, with two equal paths.

Parameters are named as in the series (`heads.{j}.W_Q|W_K|W_V` of shape [d_model d_head], `W_O`
of shape [n_heads*d_head d_model]) in state dicts; in memory all heads' q/k/v sit in one
`W_QKV` (`models.packed_heads`). The explicit path computes scores and pattern so every hook
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
from models.hooks import fire, is_hooked, passthrough
from models.layers import affine, make_norm
from models.packed_heads import KINDS, HeadView, pack_state_dict, packed_source, unpack_state_dict

ATTN_IMPLS = ("auto", "explicit", "fused")
FINITE = object()  # `qkv_weights`' guard when the model guards all layers at once: nothing to add per layer
# (output, logsumexp) of causal attention in one fused call; private, so looked up, not assumed
FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def guard_per_call(W: torch.Tensor) -> bool:
    """Whether the weight guard must be computed afresh at this call: gradients on (the weights
    change at every step) or torch.compile tracing (nothing cached in a graph)."""
    return (torch.is_grad_enabled() and W.requires_grad) or torch.compiler.is_compiling()


def attention_scale(cfg: TransformerConfig) -> float:
    """The divisor applied to q.k: 1, sqrt(d_model) (the series) or sqrt(d_head) (GPT)."""
    if cfg.attn_scale == "none":
        return 1.0
    if cfg.attn_scale == "sqrt_d_model":
        return math.sqrt(cfg.d_model)
    return math.sqrt(cfg.d_head)


class Attention(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.scale = attention_scale(cfg)
        self.impl = "auto"
        self.use_attn_result = False  # set True to fill hook_result [batch pos head d_model]
        self._guard_cache: tuple | None = None  # (key, weight_guard) while the weights are unchanged
        self._qk_views: tuple | None = None  # (storage key, views) for `qk_weights`
        # set by probes (`probes.rows.qk.softmax_sinks`): called as sink(q, k, lse, weighted_k) with
        # each row's softmax statistics from this layer's own attention call (None, None if none)
        self.softmax_sink = None
        if cfg.attn_out_proj:  # registered first: the parameter order of the per-head layout
            self.W_O = nn.Parameter(torch.empty(cfg.d_attn, cfg.d_model))
            if cfg.has_out_bias:
                self.b_O = nn.Parameter(torch.zeros(cfg.d_model))
        # every head's q/k/v in one parameter; `heads[j].W_Q` and the state dict keep the series'
        # per-head names (`models.packed_heads`)
        self.W_QKV = nn.Parameter(torch.empty(cfg.d_model, 3 * cfg.d_attn))  # [d_model (3 head d_head)]
        if cfg.attn_bias:
            self.b_QKV = nn.Parameter(torch.zeros(3 * cfg.d_attn))  # [(3 head d_head)]
        if cfg.qk_norm != "none":  # per head over d_head; hooks q_norm.hook_scale|hook_normalized
            self.q_norm = make_norm(cfg.qk_norm, cfg.d_head, cfg.norm_eps, cfg.norm_bias)
            self.k_norm = make_norm(cfg.qk_norm, cfg.d_head, cfg.norm_eps, cfg.norm_bias)
        self.heads = [HeadView(self, j) for j in range(cfg.n_heads)]
        self._register_state_dict_hook(unpack_state_dict)
        self.register_load_state_dict_pre_hook(pack_state_dict)
        self.hook_q = HookPoint()  # [batch pos head d_head]
        self.hook_k = HookPoint()  # [batch pos head d_head]
        self.hook_v = HookPoint()  # [batch pos head d_head]
        self.hook_attn_scores = HookPoint()  # [batch head q_pos k_pos], scaled and masked
        self.hook_pattern = HookPoint()  # [batch head q_pos k_pos]
        self.hook_z = HookPoint()  # [batch pos head d_head]
        self.hook_result = HookPoint()  # [batch pos head d_model]

    def stacked(self, name: str) -> torch.Tensor:
        """A per-head parameter stacked over heads: W_* -> [head d_model d_head], b_* -> [head d_head]
        (a view of the packed parameter)."""
        packed = packed_source(self, name)
        if packed is None:
            raise AttributeError(f"this attention has no per-head {name!r}")
        cfg, which = self.cfg, KINDS.index(name[-1])
        if name[0] == "W":
            return packed.view(cfg.d_model, 3, cfg.n_heads, cfg.d_head)[:, which].permute(1, 0, 2)
        return packed.view(3, cfg.n_heads, cfg.d_head)[which]

    def project_qkv(self, x: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        """q, k and v in one matmul, as a plain module's `c_attn`: [batch pos 3 head d_head]."""
        return affine(x, W, b).unflatten(-1, (3, self.cfg.n_heads, self.cfg.d_head))

    def qkv_weights(self, model_guard: bool = False) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """W_QKV, b_QKV (or None) and their `weight_guard`: FINITE with `model_guard` (the model
        guards every layer's weights at once, on its logits: `Transformer.logits_guard`).
        With gradients on the guard is recomputed at every call; without (probes, sampling) it is
        kept while the parameters sit at unchanged versions (an optimizer step or
        `load_state_dict` moves a version; `.to()` / `.half()` clear it in `_apply`). It stays a
        tensor added to z: checking that it is all zeros would read it on the host (a GPU sync)."""
        params = self._parameters
        W, b = params["W_QKV"], params.get("b_QKV")
        if model_guard:
            return W, b, FINITE
        if guard_per_call(W):
            return W, b, self.weight_guard(W, b)
        # ids are safe in the key: the cache keeps those parameters alive
        key = (id(W), W._version, id(b), None if b is None else b._version)
        if self._guard_cache is None or self._guard_cache[0] != key:
            with torch.no_grad():
                self._guard_cache = (key, (W, b), self.weight_guard(W, b))
        return W, b, self._guard_cache[2]

    def weight_guard(self, W: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        """[1 head 1 1] zeros, NaN where a head's q/k weights or biases hold a NaN or inf: a
        diverged head. Independent of the batch, so kept between weight changes (no cost per
        forward without gradients; a sum over the weights with them)."""
        cfg = self.cfg
        # over d_model first (a contiguous column sum, 3-4x faster than one multi-axis reduction)
        columns = torch.sum(W.detach()[:, : 2 * cfg.d_attn], dim=0, dtype=torch.float32)  # [2*head*d_head]
        total = columns.view(2, cfg.n_heads, cfg.d_head).sum(dim=(0, 2))  # [head]
        if b is not None:
            qk_b = b.detach()[: 2 * cfg.d_attn].view(2, cfg.n_heads, cfg.d_head)  # [2 head d_head]
            total = total + torch.sum(qk_b, dim=(0, 2), dtype=torch.float32)
        return total.mul_(0).view(1, cfg.n_heads, 1, 1)

    def _apply(self, fn, recurse=True):
        self._guard_cache = self._qk_views = None  # .to() / .half() may swap parameter data in place of the object
        return super()._apply(fn, recurse)

    def qk_weights(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The q and k columns of W_QKV [d_model 2*d_attn] and of b_QKV [2*d_attn] (or None):
        what `weight_guard` checks. Detached views, kept while the parameters' storage is (an
        optimizer writes into it; `.to()` or a new parameter moves it, and the views with it)."""
        params = self._parameters
        W, b = params["W_QKV"], params.get("b_QKV")
        key = (W.data_ptr(), None if b is None else b.data_ptr())
        if self._qk_views is None or self._qk_views[0] != key:
            width = 2 * self.cfg.d_attn
            W, b = W.detach(), None if b is None else b.detach()
            self._qk_views = (key, (W.narrow(1, 0, width), None if b is None else b.narrow(0, 0, width)))
        return self._qk_views[1]

    def use_fused(self) -> bool:
        if self.impl == "explicit":
            return False
        m = self._modules
        hooked = is_hooked(m["hook_attn_scores"]) or is_hooked(m["hook_pattern"])
        if self.impl == "fused" and hooked:
            raise RuntimeError("attention impl 'fused' cannot feed hooks on scores or pattern")
        return not hooked

    def forward(self, x: torch.Tensor, plain: bool = False) -> torch.Tensor:
        # x: [batch pos d_model]. plain: the model found nothing hooked (`models.hooks.unobserved`)
        # and guards every layer's q/k weights at once: no hook point to ask, no guard per layer
        W, b, guard = self.qkv_weights(model_guard=plain)
        q, k, v = self.project_qkv(x, W, b).unbind(dim=2)  # each [batch pos head d_head]
        m = self._modules  # not self.hook_q: nn.Module.__getattr__ costs ~1 us a lookup
        see = passthrough if plain else fire
        qk_normed = "q_norm" in m
        if qk_normed:  # hook_q / hook_k then see the q and k that make the scores
            q, k = m["q_norm"](q, plain), m["k_norm"](k, plain)
        # hooks, or norm gains, may make q or k non-finite where no q/k weight is: guard on q, k
        qk_touched = qk_normed or not plain and (is_hooked(m["hook_q"]) or is_hooked(m["hook_k"]))
        if qk_touched:
            q, k = see(m["hook_q"], q), see(m["hook_k"], k)
        v = see(m["hook_v"], v)
        if (self.impl != "explicit") if plain else self.use_fused():
            # a hook on q or k may write non-finite values that no weight shows: check those
            z = self.fused(q, k, v, None if qk_touched else guard)
        else:
            z = self.explicit(q, k, v)
            if self.softmax_sink is not None:
                self.softmax_sink(q, k, None, None)
        z = see(m["hook_z"], z)  # [batch pos head d_head]
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

    def fused(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              guard: torch.Tensor | object | None = None) -> torch.Tensor:
        """SDPA plus a guard ([batch|1 head 1 1], NaN on a diverged head): `weight_guard` when
        given, none for FINITE (weights known finite), else `nan_guard` on these q and k."""
        guard = self.nan_guard(q, k) if guard is None else guard
        sink = self.softmax_sink
        if sink is not None:
            z = self.fused_with_softmax_stats(q, k, v, sink)
        else:
            z = self.sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        if guard is not FINITE:
            z = z + guard.to(z.dtype)
        return z.transpose(1, 2)  # [batch pos head d_head]

    def fused_with_softmax_stats(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sink) -> torch.Tensor:
        """The fused attention [batch head pos d_head] of q, k, v [batch pos head d_head] that also
        hands `sink(q, k, lse, weighted_k)` each row's logsumexp [batch head pos] and sum_j p_ij k_j
        [batch head pos d_head], from the same kernel call: v' = [k | v] carries k through the
        softmax, and q padded with zeros gives v' its width (the scores are unchanged). Where that
        kernel is missing (or not float32 on CPU, or dropout is on) the sink gets None, None.
        A sink whose `ends_forward` is true stops the pass itself (raises): its layer's call takes
        v = k alone, and the output is computed only if the sink returned after all."""
        qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [batch head pos d_head]
        usable = (FLASH_CPU is not None and self.dropout_p() == 0.0 and q.device.type == "cpu"
                  and q.dtype == k.dtype == v.dtype == torch.float32 and v.shape[-1] == q.shape[-1])
        if not usable:
            sink(q, k, None, None)
            return self.sdpa(qh, kh, vh)
        if getattr(sink, "ends_forward", False):
            weighted_k, lse = FLASH_CPU(qh, kh, kh, 0.0, True, scale=1.0 / self.scale)[:2]
            sink(q, k, lse, weighted_k)
            return self.sdpa(qh, kh, vh)
        d = vh.shape[-1]
        # q' = [q | 0] and k' = v' = [k | v]: q'.k' = q.k, and one tensor serves as keys and values
        # (one copy fewer than padding k as well); q' zeroes only its padding (F.pad fills it all)
        padded_q = qh.new_empty(*qh.shape[:-1], 2 * d)  # [batch head pos 2*d]
        padded_q[..., d:].zero_()
        padded_q[..., :d].copy_(qh)
        keys_values = torch.cat([kh, vh], dim=-1)  # [batch head pos 2*d]
        out, lse = FLASH_CPU(padded_q, keys_values, keys_values, 0.0, True,
                             scale=1.0 / self.scale)[:2]  # [batch head pos 2*d], [.. pos]
        sink(q, k, lse, out[..., :d])
        return out[..., d:]

    def sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal SDPA of q, k, v [batch head pos d_head] at this layer's scale and dropout."""
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout_p(),
                                              scale=1.0 / self.scale)

    def dropout_p(self) -> float:
        return self.cfg.dropout if self.training else 0.0

    @staticmethod
    def nan_guard(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """[batch head 1 1] zeros, NaN where that (batch, head)'s q or k holds a NaN or inf.

        SDPA kernels may turn NaN or inf scores into zero output (the CPU one does for +-inf),
        hiding a diverged head that the explicit path shows as NaN; x * 0 is NaN exactly when x
        is not finite, so adding this re-poisons the head without a host sync. Used when hooks
        may have edited q or k (else the cheaper `weight_guard` does). Sums run over
        [batch pos head d_head] as stored (the fastest order) and accumulate in fp32 without a
        copy (an fp16 sum of healthy activations can overflow to inf); detached, so backward
        skips it (its gradient is zero anyway)."""
        q, k = (q.detach(), k.detach()) if q.requires_grad or k.requires_grad else (q, k)
        # q, k: [batch pos head d_head]
        total = torch.sum(q, dim=(1, 3), dtype=torch.float32).add_(torch.sum(k, dim=(1, 3), dtype=torch.float32))
        guard = total.mul_(0).view(*total.shape, 1, 1)  # [batch head 1 1]
        return guard if guard.dtype == q.dtype else guard.to(q.dtype)

    def output(self, z: torch.Tensor) -> torch.Tensor:
        batch, pos = z.shape[:2]
        if self.use_attn_result:
            result = fire(self.hook_result, torch.einsum("bphe,hed->bphd", z, self.per_head_W_O()))
            out = result.sum(dim=2)  # [batch pos d_model]
        elif self.cfg.attn_out_proj:
            params = self._parameters
            return affine(z.reshape(batch, pos, self.cfg.d_attn), params["W_O"], params.get("b_O"))  # [batch pos d_model]
        else:
            return z.reshape(batch, pos, self.cfg.d_attn)  # the series' single head: no W_O
        if self.cfg.has_out_bias:
            out = out + self.b_O
        return out  # [batch pos d_model]

    def per_head_W_O(self) -> torch.Tensor:
        """W_O split by head: [head d_head d_model]; without W_O, each head writes its own slice."""
        cfg = self.cfg
        W_O = self.W_O if cfg.attn_out_proj else torch.eye(
            cfg.d_attn, dtype=self.W_QKV.dtype, device=self.W_QKV.device)
        return W_O.view(cfg.n_heads, cfg.d_head, -1)
