"""Row statistics of causal attention computed blockwise from q and k, never the whole pattern.

For row i of a head with scores s_ij = q_i . k_j / scale over the keys j <= i it may see:
`H_i = logsumexp(s_i) - sum_j softmax(s_i)_j s_ij` (nats), the max probability, the mass on key
0, on key i (the diagonal) and on key i - 1 (the sub-diagonal). Query rows go in blocks of
QUERY_BLOCK and windows in chunks, so the largest temporary is about CHUNK_ELEMENTS floats
whatever the context: an 8192-token context needs no [batch head 8192 8192] tensor, and the
model itself stays on its fused attention path (only hook_q / hook_k are observed).

The series' formula `-sum p ln(p + 1e-10)` differs from the exact H by less than
1e-10 per key (p ln(1 + eps/p) <= eps), so under 1e-6 at any context a model here has.

This holds only where the pattern *is* softmax(q k^T / scale + causal mask): `qk_path_scale`
checks that on a short window against the model's own hook_pattern (rotary embeddings applied
after hook_q, grouped keys, ALiBi or another scale all fail the check) and callers fall back to
the pattern hook when it fails.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from probes.rows.head_types import first_position_rows, previous_token_rows  # the head-type definitions

CHUNK_ELEMENTS = 1 << 22  # bound on a block's temporary: 16 MB of float32
QUERY_BLOCK = 64
CHECK_TOKENS = 64  # length of the window on which the q/k route is checked against the pattern


def qk_row_stats(q: torch.Tensor, k: torch.Tensor, scale: float, evidence: bool = True,
                 fused: bool = True, softmax: tuple | None = None) -> dict[str, torch.Tensor]:
    """Per-row statistics of one layer: q, k [batch pos head d_head] -> name -> [batch head pos].

    Names: `entropy`, and with `evidence` also `max_prob`, `first`, `diag`, `subdiag` (row 0's
    sub-diagonal is 0). Computed in float32 (float64 stays float64). Entropy alone comes from the
    fused kernel where `fused` and there is one (`fused_row_entropy`; `softmax`, the model's own
    call's (lse, sum p k) where it gave them), else blockwise."""
    if fused and not evidence:
        entropy = fused_row_entropy(q, k, scale, softmax)
        if entropy is not None:
            return {"entropy": entropy}
    dtype = q.dtype if q.dtype == torch.float64 else torch.float32
    q = q.transpose(1, 2).to(dtype) / scale  # [batch head pos d_head]
    k = k.transpose(1, 2).to(dtype)
    batch, heads, n, _ = q.shape
    names = ("entropy", "max_prob", "first", "diag", "subdiag") if evidence else ("entropy",)
    out = {name: q.new_zeros(batch, heads, n) for name in names}
    windows_per_chunk = max(1, CHUNK_ELEMENTS // (heads * min(n, QUERY_BLOCK) * n))
    for w in range(0, batch, windows_per_chunk):
        rows = slice(w, w + windows_per_chunk)
        for a in range(0, n, QUERY_BLOCK):
            b = min(n, a + QUERY_BLOCK)
            block = _block_stats(q[rows, :, a:b], k[rows, :, :b], a, evidence)
            for name, value in block.items():
                out[name][rows, :, a:b] = value
    return out


# (output, logsumexp) of causal attention in one fused call, no [n n] tensor; private, so guarded
FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
# float32 cancellation on the fused route (`fused_row_entropy`) is bounded per row by `bound`; a
# row past ROW_TOL is recomputed exactly, and so are the largest others until the bounds' root sum
# of squares over a head's rows is MEAN_TOL * rows: the rounding errors are independent and of
# either sign (measured means ~1e-8 where rows err ~1e-6), so a head's mean keeps ~1e-7, and a
# mean over one or two rows (every row redone past ~1e-7) as much
ROW_TOL = 4e-6
MEAN_TOL = 1e-7
F32_EPS = float(torch.finfo(torch.float32).eps)


def fused_row_entropy(q: torch.Tensor, k: torch.Tensor, scale: float,
                      softmax: tuple | None = None) -> torch.Tensor | None:
    """Row entropy [batch head pos] (float32) from q, k [batch pos head d_head] through the fused
    kernel, or None where there is none (not a float32 CPU tensor, or no such op in this torch).
    `softmax` = (lse [batch head pos], out [batch head pos d_head]) as that kernel gives them, when
    the model's own attention call already did (`softmax_sinks`): then no second call is made.

    With v = k the kernel gives out_i = sum_j p_ij k_j and lse_i, so sum_j p_ij s_ij = q_i . out_i
    / scale and H_i = lse_i - q_i . out_i / scale. The two terms cancel: float32 leaves an error of
    about eps * (|lse_i| + sum_d |q_id out_id| / scale), small on healthy heads, 1e-3 on a collapsed
    head with scores ~1e4. Rows `rows_to_redo` picks (a large bound, a non-finite q or k) are
    recomputed exactly from their scores (`exact_rows`)."""
    if FLASH_CPU is None or q.device.type != "cpu" or q.dtype != torch.float32 or k.dtype != torch.float32:
        return None
    q, k = q.transpose(1, 2), k.transpose(1, 2)  # [batch head pos d_head]
    if softmax is None:
        out, lse = FLASH_CPU(q, k, k, 0.0, True, scale=1.0 / scale)  # [batch head pos d_head], [.. pos]
    else:
        lse, out = softmax
    terms = q * out  # [batch head pos d_head]
    entropy = lse - terms.sum(dim=-1).div_(scale)  # [batch head pos]
    entropy[..., 0] = 0.0  # one visible key: exactly one-hot (a non-finite row 0 is redone below)
    bound = terms.abs_().sum(dim=-1).div_(scale).add_(lse.abs()).mul_(F32_EPS)  # [batch head pos]
    # a non-finite q or k anywhere in a (batch, head): its rows go the exact way (one sum each)
    # (one sum over everything first: the usual all-finite case needs no per-head sums)
    if bool(torch.isfinite(q.sum() + k.sum())):
        finite = torch.ones(q.shape[:2], dtype=torch.bool, device=q.device)  # [batch head]
    else:
        finite = torch.isfinite(q.sum(dim=(2, 3)) + k.sum(dim=(2, 3)))
    unsure = rows_to_redo(bound, finite)
    if bool(unsure.any()):
        exact_rows(q, k, scale, unsure, entropy)
    return entropy


def rows_to_redo(bound: torch.Tensor, finite: torch.Tensor) -> torch.Tensor:
    """Which fused rows to recompute exactly: bound [batch head pos] -> bool [batch head pos].

    Rows of a non-finite (batch, head) (`finite` [batch head]), rows past ROW_TOL (NaN too), then
    per head the largest others while their root sum of squares exceeds MEAN_TOL * rows. Row 1
    counts 1 / ln 2 times (normalised entropy divides it by ln 2); row 0 is exact already."""
    batch, heads, n = bound.shape
    unsure = ~(bound <= ROW_TOL) | ~finite[..., None]
    weight = torch.ones(n, device=bound.device)
    weight[0], weight[1:2] = 0.0, 1 / math.log(2)
    squares = (bound * weight).square_().masked_fill_(unsure, 0.0)  # [batch head pos]
    per_head = squares.transpose(0, 1).reshape(heads, batch * n)  # [head rows]
    budget = (MEAN_TOL * batch * max(n - 1, 1)) ** 2
    if bool((per_head.sum(dim=-1) <= budget).all()):  # the usual case: no head needs more rows redone
        return unsure
    ranked = per_head.sort(dim=-1, descending=True).values  # [head rows]
    # drop the k largest, k the fewest leaving what remains within the budget (0 if already so)
    removed = ranked.cumsum(dim=-1) - ranked  # [head rows]: sum of the ones ranked before
    keep_from = (ranked.sum(dim=-1, keepdim=True) - removed > budget).sum(dim=-1)  # [head]
    cutoff = ranked.gather(-1, (keep_from - 1).clamp(min=0)[:, None])[:, 0]  # smallest dropped
    over = (squares >= cutoff[None, :, None]) & (keep_from > 0)[None, :, None]
    return unsure | (over & (squares > 0))


def exact_rows(q: torch.Tensor, k: torch.Tensor, scale: float, rows: torch.Tensor, entropy: torch.Tensor) -> None:
    """Overwrite entropy [batch head pos] at `rows` [batch head pos] (bool) with the exact value
    from the scores of q, k [batch head pos d_head], as the blockwise route computes it."""
    positions = torch.arange(k.shape[2], device=k.device)
    for b, h in rows.any(dim=-1).nonzero().tolist():
        for i in rows[b, h].nonzero().squeeze(1).split(QUERY_BLOCK):  # [r] row indices
            scores = (q[b, h, i] / scale) @ k[b, h].T  # [r pos]
            entropy[b, h, i] = _masked_entropy(scores, positions > i[:, None])[0]


def _block_stats(q: torch.Tensor, k: torch.Tensor, a: int, evidence: bool) -> dict[str, torch.Tensor]:
    """Rows a..a+qb-1, which see keys < a+qb: q [batch head qb d_head], k [batch head b d_head]."""
    qb, b = q.shape[2], k.shape[2]
    scores = q @ k.transpose(-1, -2)  # [batch head qb b]
    hidden = torch.ones(qb, b, dtype=torch.bool, device=q.device).triu_(a + 1)  # key j > row a+i
    entropy, p, total = _masked_entropy(scores, hidden)
    stats = {"entropy": entropy}
    if evidence:
        p.div_(total.unsqueeze(-1))  # softmax
        stats["max_prob"] = total.reciprocal()  # the max's weight is e^0 = 1
        stats["first"] = first_position_rows(p)
        stats["diag"] = p.diagonal(offset=a, dim1=-2, dim2=-1)
        stats["subdiag"] = previous_token_rows(p, first_row=a)  # rows a..: key a+i-1 (none for row 0)
    return stats


def _masked_entropy(scores: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row entropy of softmax(scores) over the keys not `hidden`, overwriting scores:
    [... r b] -> (H [... r], unnormalised weights e^(s - max) [... r b], their sum [... r])."""
    # a finite floor, not -inf: softmax weight exp(floor - max) is exactly 0 and 0 * floor is 0,
    # where 0 * -inf would be NaN; real scores of a diverged head still carry their NaN
    scores.masked_fill_(hidden, torch.finfo(scores.dtype).min)
    # shifted by the row max (s' <= 0), H = ln(sum e^s') - sum p s': no cancellation between two
    # large numbers when a collapsed head's scores are large
    shifted = scores.sub_(scores.amax(dim=-1, keepdim=True))
    p = shifted.exp()
    total = p.sum(dim=-1)
    return total.log() - (p * shifted).sum(dim=-1) / total, p, total


def candidate_scale(model: Any) -> float | None:
    """The divisor of q.k this model says it uses: ours from its config switch, TransformerLens'
    `cfg.attn_scale` (sqrt(d_head) where it is left unset at -1, 1 when `use_attn_scale` is off);
    None if the model does not say."""
    cfg = getattr(model, "cfg", None)
    scale = getattr(cfg, "attn_scale", None)
    if isinstance(scale, str):  # ours: "none" | "sqrt_d_model" | "sqrt_d_head"
        from models.attention import attention_scale
        return attention_scale(cfg)
    if not isinstance(scale, (int, float)) or not math.isfinite(scale):
        return None
    if not getattr(cfg, "use_attn_scale", True):
        return 1.0
    d_head = getattr(cfg, "d_head", None)
    if scale <= 0 and isinstance(d_head, int) and d_head > 0:
        return math.sqrt(d_head)
    return float(scale) if scale > 0 else None


def qk_path_scale(model: Any, tokens: torch.Tensor, layers: list[int]) -> float | None:
    """The scale with which softmax(q k^T / scale + causal mask) reproduces every wanted layer's
    hook_pattern on the first window's first CHECK_TOKENS tokens (to 1e-5), else None."""
    scale = candidate_scale(model)
    if scale is None:
        return None
    seen: dict[str, torch.Tensor] = {}

    def keeper(name: str):  # keyed by the name asked for: a bridge's hook.name is its alias
        def keep(tensor: torch.Tensor, hook: Any) -> None:
            seen[name] = tensor.detach()
        return keep
    names = [f"blocks.{l}.attn.{h}" for l in layers for h in ("hook_q", "hook_k", "hook_pattern")]
    with torch.inference_mode(), model.hooks(fwd_hooks=[(name, keeper(name)) for name in names]):
        model(tokens[:1, :CHECK_TOKENS])
    for l in layers:
        q, k, pattern = (seen.get(f"blocks.{l}.attn.{h}") for h in ("hook_q", "hook_k", "hook_pattern"))
        if q is None or k is None or pattern is None or q.shape != k.shape or q.dim() != 4:
            return None
        rebuilt = qk_pattern(q, k, scale)
        if rebuilt.shape != pattern.shape or not torch.allclose(
                rebuilt, pattern.to(rebuilt.dtype), atol=1e-5, rtol=1e-4, equal_nan=True):
            return None
    return scale


def qk_pattern(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """The whole causal pattern from q, k [batch pos head d_head]: [batch head q_pos k_pos]."""
    scores = torch.einsum("bqhe,bkhe->bhqk", q.float() / scale, k.float())
    n = scores.shape[-1]
    hidden = torch.ones(n, n, dtype=torch.bool, device=scores.device).triu_(1)
    return scores.masked_fill_(hidden, float("-inf")).softmax(dim=-1)


class SoftmaxSink:
    """A layer's `softmax_sink` (models.attention): hands `stats.update_qk` the rows' softmax
    statistics from the layer's own fused call, then calls `stop()`. `ends_forward` marks the
    last wanted layer, after which `stop()` raises: its attention output is never needed."""

    def __init__(self, stats: Any, layer: int, scale: float, stop: Any, ends_forward: bool):
        self.stats, self.layer, self.scale, self.stop = stats, layer, scale, stop
        self.ends_forward = ends_forward

    def __call__(self, q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor | None,
                 weighted_k: torch.Tensor | None) -> None:
        softmax = None if lse is None else (lse, weighted_k)
        self.stats.update_qk(self.layer, q.detach(), k.detach(), self.scale, softmax)
        self.stop()


def softmax_sinks(model: Any, stats: Any, layers: list[int], scale: float, stop: Any) -> list[Any] | None:
    """Where the model is ours (its attention modules take a `softmax_sink`), a `SoftmaxSink` on
    each wanted layer (one kernel call per layer instead of two); else None (use `qk_hooks`).
    Returns the modules; the caller sets their sink back to None afterwards. `stop()` must raise
    once every layer is reduced."""
    blocks = getattr(model, "blocks", None)
    modules = [getattr(blocks[l], "attention", None) for l in layers] if blocks is not None else []
    if not modules or not all(hasattr(m, "softmax_sink") for m in modules) or len(set(layers)) < len(layers):
        return None
    last = max(layers)
    for layer, module in zip(layers, modules):
        module.softmax_sink = SoftmaxSink(stats, layer, scale, stop, ends_forward=layer == last)
    return modules


def qk_hooks(stats: Any, layers: list[int], scale: float) -> list[tuple[str, Any]]:
    """Forward hooks on each layer's hook_q and hook_k: keep whichever comes first, and when the
    other arrives hand both to `stats.update_qk(layer, q, k, scale)` (a `PatternStats`)."""
    held: dict[tuple[int, str], torch.Tensor] = {}

    def hook_for(layer: int, mine: str, other: str):
        def hook(t: torch.Tensor, hook: Any) -> None:  # [batch pos head d_head]
            partner = held.pop((layer, other), None)
            if partner is None:
                held[(layer, mine)] = t.detach()
                return
            q, k = (t, partner) if mine == "q" else (partner, t)
            stats.update_qk(layer, q.detach(), k.detach(), scale)
        return hook
    return [hook for l in layers for hook in ((f"blocks.{l}.attn.hook_q", hook_for(l, "q", "k")),
                                              (f"blocks.{l}.attn.hook_k", hook_for(l, "k", "q")))]
