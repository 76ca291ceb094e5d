"""Per-row attention statistics summed per head, and the runner that collects them in one pass.

`collect_stats(model, tokens)` hooks each wanted layer and reduces it inside the hook, either from
hook_pattern (`PatternStats.update`) or blockwise from hook_q / hook_k (`probes.rows.qk`), so no
pattern outlives its layer; on a model without our hook points, each layer's pattern comes from
the attention tap (`probes.sources.tapped`, `models.tap`) or any other attention source inside its
own call. The forward pass
stops once the last wanted layer is reduced: nothing after it (later blocks, the unembedding) is
needed. `probes.entropy` and
`probes.degenerate` read the sums.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import torch

from probes.common import ProbeInputError, StopForward, progress_bar  # noqa: F401 (StopForward re-exported)
from probes.rows.head_types import first_position_rows, previous_token_rows
from probes.rows.qk import (CHUNK_ELEMENTS, QUERY_BLOCK, qk_hooks, qk_path_scale, qk_row_stats,
                            softmax_sinks)
from probes.sources import source_of
from probes.sources.attention import AttentionSource, visible_keys
from probes.sources.hooked import HookedSource

EPS = 1e-10  # the series' eps inside the log
# CHUNK_ELEMENTS bounds the hook's temporary; QUERY_BLOCK query rows go at once (rows a..b-1 of a
# causal pattern see keys < b only): the same sizes as the q/k route's
SUMS = ("entropy", "normalized", "max_prob", "first", "first_all", "diag", "subdiag", "nonfinite")


def log_keys(n: int, device: Any = None, window: int | None = None) -> torch.Tensor:
    """ln(k_i) for rows i = 0..n-1 of a causal pattern, k_i = i + 1, or min(i + 1, window) in a
    sliding-window layer (`visible_keys`): [n] float64 (0 where a row sees one key)."""
    return visible_keys(n, window, device).log()


# ---------------------------------------------------------------- in-hook reduction

def row_entropy_and_max(p: torch.Tensor, with_max: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Series entropy and max probability of every row of causal patterns: [... n n] -> [... n].

    Query rows go in blocks that skip the keys no row of the block may see (p = 0 there, adding
    0 to both), which roughly halves the work on long contexts.
    """
    n = p.shape[-1]
    ent = p.new_empty(p.shape[:-1])
    max_prob = p.new_empty(p.shape[:-1]) if with_max else None
    for a in range(0, n, QUERY_BLOCK):
        b = min(n, a + QUERY_BLOCK)
        block = p[..., a:b, :b]  # [... q_block k<b]
        ent[..., a:b] = block.add(EPS).log_().mul_(block).sum(-1).neg_()
        if max_prob is not None:
            max_prob[..., a:b] = block.amax(-1)
    return ent, max_prob


def check_causal(pattern: torch.Tensor, layer: int) -> None:
    """The runner assumes causal attention (k_i = i + 1 keys). Row 0 of a causal pattern puts
    all its mass on key 0; any finite mass on its later keys means it is not: [batch head q k]."""
    row0 = pattern[..., 0, 1:]  # NaN / inf here belong to a diverged head, not a non-causal one
    if bool((torch.isfinite(row0) & (row0 != 0)).any()):
        raise ProbeInputError(f"layer {layer}'s attention pattern is not causal (row 0 attends to "
                              f"later positions): this probe measures causal language models")


@dataclass
class PatternStats:
    """Float64 per-head sums of row statistics for the hooked layers, filled one layer at a time.

    Rows counted in `rows` are all rows; `multi_rows` are rows with >= 2 visible keys (i >= 1),
    over which normalized entropy, max probability, first-position, diagonal and sub-diagonal
    mass are averaged (row 0 is trivially one-hot on itself and would bias them).
    """

    layers: list[int]
    n_heads: int
    n_ctx: int
    sums: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)  # layer -> name -> [head]
    pos_sum: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [head n_ctx]
    pos_count: torch.Tensor | None = None  # [n_ctx] windows that had each position
    evidence: bool = True  # also max probability, first / diagonal / sub-diagonal mass
    sliding: dict[int, int] = field(default_factory=dict)  # layer -> sliding window (the source's windows)
    route: str = "pattern"  # how the rows were reduced: "qk" (hook_q/hook_k), "pattern" or "tap"
    fused: bool = True  # entropy-only q/k rows may come from the fused kernel (`probes.rows.qk`)
    reduced: int = 0  # layers reduced in the current forward pass
    rows: int = 0
    multi_rows: int = 0
    tokens: int = 0
    windows: int = 0

    def _init(self, device: torch.device) -> None:
        if device.type == "mps":  # no float64 there
            device = torch.device("cpu")
        zeros = lambda *shape: torch.zeros(*shape, dtype=torch.float64, device=device)  # noqa: E731
        self.sums = {l: {name: zeros(self.n_heads) for name in SUMS} for l in self.layers}
        self.pos_sum = {l: zeros(self.n_heads, self.n_ctx) for l in self.layers}
        self.pos_count = zeros(self.n_ctx)

    def add_batch(self, batch: int, n: int) -> None:
        """Count one batch of `batch` windows of n tokens (call once per forward pass)."""
        self.rows += batch * n
        self.multi_rows += batch * max(n - 1, 0)
        self.tokens += batch * n
        self.windows += batch
        if self.pos_count is not None:
            self.pos_count[:n] += batch

    def update(self, layer: int, pattern: torch.Tensor) -> None:
        """Add one layer's pattern [batch head q k] to the sums, a few batch rows at a time."""
        if not self.sums:
            self._init(pattern.device)
        check_causal(pattern, layer)
        _, heads, n, _ = pattern.shape
        temp_per_window = heads * min(n, QUERY_BLOCK) * n  # the largest temporary per window
        for chunk in pattern.split(max(1, CHUNK_ELEMENTS // temp_per_window), dim=0):
            self._update_chunk(layer, chunk)
        self.reduced += 1

    def _update_chunk(self, layer: int, p: torch.Tensor) -> None:
        # p: [batch head n n]
        if p.dtype not in (torch.float32, torch.float64):
            p = p.float()  # eps=1e-10 vanishes in half precision; one chunk at a time
        ent, max_prob = row_entropy_and_max(p, with_max=self.evidence)  # [batch head n] each
        rows = {"entropy": ent}
        if self.evidence:
            # "previous" and "sink" evidence: the head-type definitions of probes.heads
            rows.update(max_prob=max_prob, first=first_position_rows(p), diag=p.diagonal(dim1=-2, dim2=-1),
                        subdiag=previous_token_rows(p))
        self.add_rows(layer, rows)

    def update_qk(self, layer: int, q: torch.Tensor, k: torch.Tensor, scale: float,
                  softmax: tuple | None = None) -> None:
        """Add one layer from its q and k [batch pos head d_head] (`probes.rows.qk`: the pattern
        softmax(q k^T / scale + causal mask) is reduced block by block, never formed; `softmax`,
        the model's own fused call's (lse, sum p k) where a sink received them)."""
        if not self.sums:
            self._init(q.device)
        self.add_rows(layer, qk_row_stats(q, k, scale, evidence=self.evidence, fused=self.fused,
                                          softmax=softmax))
        self.reduced += 1

    def add_rows(self, layer: int, rows: dict[str, torch.Tensor]) -> None:
        """Add per-row statistics name -> [batch head n] (row i sees keys 0..i) to the sums."""
        s, dev = self.sums[layer], self.sums[layer]["entropy"].device
        ent = rows["entropy"]
        n = ent.shape[-1]
        s["nonfinite"] += (~torch.isfinite(ent)).sum(dim=(0, 2)).to(dev, torch.float64)
        ent = ent.to(dev, torch.float64)
        s["entropy"] += ent.sum(dim=(0, 2))
        self.pos_sum[layer][:, :n] += ent.sum(dim=0)
        window = self.sliding.get(layer)
        if n > 1 and (window is None or window > 1):  # H_i / ln(k_i): k_i within the layer's window
            s["normalized"] += (ent[..., 1:] / log_keys(n, dev, window)[1:]).sum(dim=(0, 2))
        if not self.evidence:
            return
        first = rows["first"].to(dev, torch.float64)  # [batch head n]
        s["first_all"] += first.sum(dim=(0, 2))
        if n > 1:
            s["first"] += first[..., 1:].sum(dim=(0, 2))
            for name in ("max_prob", "diag", "subdiag"):
                s[name] += rows[name][..., 1:].to(dev, torch.float64).sum(dim=(0, 2))

    def mean(self, name: str) -> torch.Tensor:
        """Per-row mean of a statistic: [layer head] float64 over the hooked layers (NaN if no rows)."""
        per_all = name in ("entropy", "first_all")
        count = self.rows if per_all else self.multi_rows
        grid = torch.stack([self.sums[l][name].cpu() for l in self.layers])
        if name == "normalized":  # a window of one key leaves no row with two
            grid[[i for i, l in enumerate(self.layers) if self.sliding.get(l, 2) < 2]] = float("nan")
        return grid / count if count else torch.full_like(grid, float("nan"))

    def count(self, name: str) -> torch.Tensor:
        return torch.stack([self.sums[l][name].cpu() for l in self.layers])  # [layer head]

    def per_position(self) -> torch.Tensor:
        """Mean entropy at each query position: [layer head pos] up to the longest window."""
        assert self.pos_count is not None
        n = int((self.pos_count > 0).sum())
        grid = torch.stack([self.pos_sum[l][:, :n].cpu() for l in self.layers])
        return grid / self.pos_count[:n].cpu()


# ---------------------------------------------------------------- the runner

ROUTES = ("auto", "qk", "pattern")
QK_MIN_CONTEXT = 128  # "auto" reduces longer windows from q and k (at 128 the two routes tie)


def collect_stats(model: Any, tokens: torch.Tensor | Iterable[torch.Tensor], *,
                  layers: Sequence[int] | None = None, batch_size: int = 16,
                  progress: bool | None = None, evidence: bool = True, route: str = "auto",
                  fused: bool = True) -> PatternStats:
    """Per-head row statistics of `model` (an attention source, or anything `source_of` makes one
    of) over the tokens, each wanted layer reduced as it is read; each forward pass stops once the
    last wanted layer is reduced.

    At hook points (`collect_hooked`), `route` picks how: "qk" reduces each layer from hook_q /
    hook_k (`probes.rows.qk`: no [batch head n n] tensor, the model stays on its fused attention
    path); "pattern" from hook_pattern; "auto" takes "qk" when a check on a short window shows
    that the model's pattern is softmax(q k^T / scale + causal mask), "pattern" otherwise, for
    windows of at most QK_MIN_CONTEXT tokens (there the model's explicit path costs little and
    the pattern route is the faster: `benchmarks/bench_entropy.py`) and for a model with sliding
    windows. `fused` lets entropy-only q/k rows come from the fused attention kernel
    (`probes.rows.qk.fused_row_entropy`: up to ~4e-6 per row, a head's mean within ~1e-7; pass False
    where single rows are reported, to get the blockwise ones). Any other source hands each
    layer's pattern to `PatternStats.update` (`collect_read`)."""
    if route not in ROUTES:
        raise ValueError(f"route must be one of {ROUTES}, got {route!r}")
    attn = source_of(model, tokens)
    layers = list(range(attn.dims.n_layers)) if layers is None else list(dict.fromkeys(layers))  # once each
    for layer in layers:
        attn.check(layer)
    batches = attn.batches(tokens, batch_size)
    stats = PatternStats(layers, attn.dims.n_heads, max(b.shape[1] for b in batches), evidence=evidence,
                         fused=fused, sliding=attn.windows)
    if isinstance(attn, HookedSource):
        return collect_hooked(attn, batches, stats, route, progress)
    if route == "qk":
        raise ProbeInputError("the qk route reads hook_q / hook_k, which only our models and a "
                              "TransformerBridge have: use route=\"auto\" on other models")
    return collect_read(attn, batches, stats, progress)


def collect_hooked(attn: HookedSource, batches: list[torch.Tensor], stats: PatternStats, route: str,
                   progress: bool | None) -> PatternStats:
    """`collect_stats` at hook points, with reducing hooks on each wanted layer (removed afterwards,
    also when the forward pass raises), in eval mode (the mode put back after)."""
    if route == "qk" and attn.windows:
        raise ProbeInputError(f"layers {sorted(attn.windows)} have sliding windows, which the qk route (causal "
                              "rows over every earlier key) does not model: use the pattern route")
    if route == "auto" and (stats.n_ctx <= QK_MIN_CONTEXT or attn.windows):
        route = "pattern"
    model, layers, sinks = attn.model, stats.layers, None
    with attn.reading():
        try:
            scale = None
            if route != "pattern":
                scale = qk_path_scale(model, batches[0].to(attn.device), layers)
                if scale is None and route == "qk":
                    raise ProbeInputError("this model's attention pattern is not softmax(q k^T / scale + causal "
                                          "mask) of its hook_q / hook_k: use the pattern route")
            stats.route = "pattern" if scale is None else "qk"
            if scale is not None and stats.fused and not stats.evidence:  # entropy from the model's own kernel
                sinks = softmax_sinks(model, stats, layers, scale, stop=lambda: stop_if_reduced(stats))
            fwd_hooks = [] if sinks is not None else stop_when_reduced(
                pattern_hooks(stats, layers) if scale is None else qk_hooks(stats, layers, scale), stats)
            with torch.inference_mode(), model.hooks(fwd_hooks=fwd_hooks):
                for batch in progress_bar(batches, progress, "attention"):  # hooks removed even on errors
                    forward_until_reduced(model, batch.to(attn.device), stats)
                    stats.add_batch(*batch.shape)
        finally:
            for module in sinks or ():
                module.softmax_sink = None
    return stats


def collect_read(attn: AttentionSource, batches: list[torch.Tensor], stats: PatternStats,
                 progress: bool | None) -> PatternStats:
    """`collect_stats` on any other source (the tap, saved readings): each layer's pattern reduced
    inside its call by `PatternStats.update`; the pass ends after the last wanted layer."""
    stats.route = attn.kind
    with attn.reading():
        for batch in progress_bar(batches, progress, "attention"):
            stats.reduced = 0
            done = attn.each_layer_pattern(batch.to(attn.device), stats.layers, stats.update)
            if done != len(stats.layers):
                raise RuntimeError(f"{done} of {len(stats.layers)} layers were read in a forward pass")
            stats.add_batch(*batch.shape)
    return stats


def pattern_hooks(stats: PatternStats, layers: list[int]) -> list[tuple[str, Any]]:
    def hook_for(layer: int):
        def hook(pattern: torch.Tensor, hook: Any) -> None:  # pattern: [batch head q k]
            stats.update(layer, pattern.detach())
        return hook
    return [(f"blocks.{l}.attn.hook_pattern", hook_for(l)) for l in layers]


def stop_if_reduced(stats: PatternStats) -> None:
    if stats.reduced == len(stats.layers):
        raise StopForward


def stop_when_reduced(fwd_hooks: list[tuple[str, Any]], stats: PatternStats) -> list[tuple[str, Any]]:
    """The same hooks, each raising StopForward after it when all of `stats.layers` are reduced."""
    def stopping(fn: Any):
        def hook(tensor: torch.Tensor, hook: Any) -> None:
            fn(tensor, hook)
            stop_if_reduced(stats)
        return hook
    return [(name, stopping(fn)) for name, fn in fwd_hooks]


def forward_until_reduced(model: Any, batch: torch.Tensor, stats: PatternStats) -> None:
    """One forward pass over [batch pos], cut short by StopForward; every layer must be reduced.
    Raising through the model leaves no state behind: a forward holds none beyond its locals."""
    stats.reduced = 0
    try:
        model(batch)
    except StopForward:
        pass
    if stats.reduced != len(stats.layers):
        raise RuntimeError(f"{stats.reduced} of {len(stats.layers)} hooked layers were reduced in a forward pass")
