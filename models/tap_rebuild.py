"""Attention rebuilt from one call's own arguments, for the tap (`models.tap`): pure functions.

`sdpa_arguments` binds a `scaled_dot_product_attention` call's positional and keyword arguments;
`sdpa_scores` rebuilds its pre-softmax scores `[batch head q k]` (-inf where masked) exactly as
the call defines them: `scale` (default 1/sqrt(E)), `is_causal` top-left aligned (row i sees keys
j <= i, also when q and k lengths differ), a boolean `attn_mask` (True takes part) or an additive
one, broadcast; fewer kv heads than query heads with `enable_gqa` (query head h reads kv head
h // (Hq / Hkv)). `check_output` compares `pattern @ v` with the call's real output (on up to
CHECKED_ROWS query rows: the check would otherwise cost as much as the attention) and raises a
one-line `TapError` on a mismatch. `softmax_scores` turns an explicit softmax's input into scores
with -inf where an additive mask hid a key (Hugging Face eager adds the dtype's minimum).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch


class TapError(ValueError):
    """The tap cannot read a model's attention, or what it read does not match the model's own
    output: one line saying what and what to switch."""


SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
SDPA_DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}


@dataclass
class SdpaArgs:
    query: torch.Tensor  # [batch head q E] (or [batch q E]: one head)
    key: torch.Tensor  # [batch kv_head k E]
    value: torch.Tensor  # [batch kv_head k Ev]
    attn_mask: torch.Tensor | None
    dropout_p: float
    is_causal: bool
    scale: float | None
    enable_gqa: bool


def sdpa_arguments(args: tuple, kwargs: dict) -> SdpaArgs:
    """The call's arguments by name (positional ones in the function's order)."""
    bound = dict(SDPA_DEFAULTS)
    bound.update(zip(SDPA_PARAMS, args))
    bound.update({k: v for k, v in kwargs.items() if k in SDPA_PARAMS})
    return SdpaArgs(**bound)


def as_heads(t: torch.Tensor, what: str) -> torch.Tensor:
    """[batch head n E] from the 3-D (one head) or 4-D tensors SDPA takes."""
    if t.dim() == 3:
        return t.unsqueeze(1)
    if t.dim() == 4:
        return t
    raise TapError(f"scaled_dot_product_attention's {what} has shape {tuple(t.shape)}: the tap reads "
                   "[batch head pos d] or [batch pos d] attention only")


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    return t.dtype if t.dtype in (torch.float32, torch.float64) else torch.float32


def expand_kv(t: torch.Tensor, n_heads: int) -> torch.Tensor:
    """kv heads [batch kv_head ...] repeated to the query heads (GQA)."""
    n_kv = t.shape[1]
    if n_kv == n_heads:
        return t
    if n_kv < 1 or n_heads % n_kv:
        raise TapError(f"scaled_dot_product_attention got {n_heads} query heads over {n_kv} kv heads, "
                       "which do not divide")
    return t.repeat_interleave(n_heads // n_kv, dim=1)


def sdpa_scores(a: SdpaArgs) -> torch.Tensor:
    """Pre-softmax scores of the call: [batch head q k], -inf where the call masks a key."""
    dtype = compute_dtype(a.query)
    q = as_heads(a.query, "query").to(dtype)
    k = expand_kv(as_heads(a.key, "key").to(dtype), q.shape[1])
    scale = 1.0 / math.sqrt(q.shape[-1]) if a.scale is None else float(a.scale)
    (b, h, n_q, e), n_k = q.shape, k.shape[-2]
    # top-left aligned causal mask (row i sees keys 0..i), added inside the one matmul with the scale
    causal = torch.zeros(n_q, n_k, dtype=dtype, device=q.device)
    if a.is_causal:
        causal.masked_fill_(torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).triu_(1), float("-inf"))
    scores = torch.baddbmm(causal, q.reshape(b * h, n_q, e), k.reshape(b * h, n_k, e).transpose(1, 2),
                           alpha=scale).view(b, h, n_q, n_k)  # [batch head q k]
    mask = a.attn_mask
    if mask is None:
        return scores
    mask = mask if mask.dim() != 3 or a.query.dim() != 4 else mask.unsqueeze(1)  # [batch q k]: every head
    if mask.dtype == torch.bool:
        return scores.masked_fill(~mask, float("-inf"))
    return hide_minimum(scores + mask.to(dtype))  # additive: Hugging Face's dtype minimum hides a key


def hide_minimum(scores: torch.Tensor) -> torch.Tensor:
    """An additive mask of the dtype's minimum (Hugging Face's) read as -inf: the key is hidden."""
    floor = torch.finfo(scores.dtype).min / 2
    return scores.masked_fill(scores <= floor, float("-inf"))  # no host read of whether any key is hidden


def softmax_scores(x: torch.Tensor) -> torch.Tensor:
    """An explicit softmax's input as scores: a floating copy with -inf where masked."""
    return hide_minimum(x.to(compute_dtype(x)))


def relative_tolerance(dtype: torch.dtype) -> float:
    return 1e-3 if dtype in (torch.float32, torch.float64) else 3e-2


CHECKED_ROWS = 128  # query rows of each call whose output is checked (evenly spread, the last included)


def checked_rows(n: int) -> slice:
    """The query rows `check_output` compares: all of them up to CHECKED_ROWS, else every k-th
    row ending at the last (a rebuild with a wrong scale, mask or kv-head mapping is off on most
    rows, not a few): a strided view, nothing copied."""
    step = -(-n // CHECKED_ROWS)
    return slice((n - 1) % step, n, step)


def check_output(pattern: torch.Tensor, a: SdpaArgs, out: torch.Tensor, where: str) -> None:
    """`pattern @ v` against the call's real output on `checked_rows`, relative to the values'
    scale; a mismatch is refused in one line. Rows the call leaves all-masked (NaN in some
    kernels, 0 in others) and entries where both are non-finite (a diverged model) are skipped."""
    rows = checked_rows(pattern.shape[-2])
    p = pattern[..., rows, :]  # [batch head rows k]
    v = expand_kv(as_heads(a.value, "value").to(p.dtype), p.shape[1])
    mine = torch.matmul(p, v)  # [batch head rows Ev]
    real = as_heads(out, "output")[..., rows, :].to(p.dtype)
    fin_mine, fin_real = torch.isfinite(mine), torch.isfinite(real)
    scale = float(torch.nan_to_num(v, nan=0.0, posinf=0.0, neginf=0.0).abs().max()) if v.numel() else 1.0
    # autocast casts the call's float32 arguments down before the kernel runs: its output's dtype
    # says the precision it computed at
    computed = out.dtype if out.dtype.is_floating_point and out.itemsize < a.query.itemsize else a.query.dtype
    tol = relative_tolerance(computed) * max(scale, 1e-30)
    err = (mine - real).abs().masked_fill_(~(fin_mine & fin_real), 0.0)
    worst = float(err.max()) if err.numel() else 0.0
    disagree = fin_mine != fin_real
    if bool(disagree.any()):  # only rows with a real softmax count (not all-masked ones)
        disagree &= torch.isfinite(p).all(-1, keepdim=True)
    if worst > tol or bool(disagree.any()):
        raise TapError(f"the attention rebuilt from {where}'s scaled_dot_product_attention arguments does not "
                       f"match its output (largest difference {worst:.3g}, values up to {scale:.3g}): its kernel "
                       "computes something else; read it with attn_implementation=\"eager\" or an explicit softmax")
