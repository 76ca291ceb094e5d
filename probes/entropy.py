"""Attention entropy per layer and head, as the series logged it, and normalised.

    from probes import entropy
    result = entropy.run(model, tokens)          # our models or a TransformerBridge
    print(result.series_display())               # {0: [0.69, 0.158, 1.011, 0.861], ...}
    result.to_dict()                             # == python -m probes.entropy ... --json

Definitions (DESIGN.md, "Probes"): for row i of a head's causal pattern p,
`H_i = -sum_j p_ij ln(p_ij + 1e-10)` over the keys row i may see. `entropy` is the series'
`-(p * (p + 1e-10).log()).sum(-1).mean()`: the mean over every window and *every* row, row 0
(always one-hot, H = 0) included, in nats. `entropy_normalized` is the mean of `H_i / ln(k_i)`
with k_i = i + 1 visible keys, over rows with at least two keys: 1 = uniform, 0 = one-hot.

The runner hooks only `blocks.{l}.attn.hook_pattern` and reduces each layer's pattern to
per-head sums inside the hook (returning None), so no pattern outlives its layer: peak memory
is about one layer's scores and pattern. `PatternStats` also holds what `probes.degenerate`
needs (max probability, mass on the first position, diagonal and sub-diagonal).
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import torch

from probes.common import (ProbeInputError, add_input_arguments, as_batches, check_layer_head,
                           model_device, print_json, progress_bar, require_attention, run_cli,
                           to_jsonable, token_batches, tokens_or_text)
from probes.qk_rows import qk_hooks, qk_path_scale, qk_row_stats

log = logging.getLogger(__name__)

EPS = 1e-10  # the series' eps inside the log
CHUNK_ELEMENTS = 1 << 22  # bound on the hook's temporary: 16 MB of float32
QUERY_BLOCK = 64  # query rows reduced at once; rows a..b-1 of a causal pattern see keys < b only
SUMS = ("entropy", "normalized", "max_prob", "first", "first_all", "diag", "subdiag", "nonfinite")


# ---------------------------------------------------------------- pure functions on patterns

def attention_entropy(pattern: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """Per-row entropy in nats, the series' formula: [... q k] -> [... q]."""
    return -(pattern * (pattern + eps).log()).sum(-1)


def series_entropy(pattern: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """The series' logged number per head: mean over batch and all rows. [batch head q k] -> [head]."""
    return attention_entropy(pattern, eps).mean(dim=(0, 2))


def log_keys(n: int, device: Any = None) -> torch.Tensor:
    """ln(k_i) for rows i = 0..n-1 of a causal pattern, k_i = i + 1: [n] float64 (row 0 is 0)."""
    return torch.arange(1, n + 1, dtype=torch.float64, device=device).log()


def normalized_entropy(pattern: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """H_i / ln(i + 1) for the rows with two or more keys: [... q k] -> [... q-1] (rows 1..q-1)."""
    ent = attention_entropy(pattern, eps)[..., 1:]
    return ent / log_keys(pattern.shape[-2], ent.device)[1:].to(ent.dtype)


def uniform_series_entropy(n: int) -> float:
    """The series' mean entropy of a causal head attending uniformly over n rows: ln(n!) / n."""
    return math.lgamma(n + 1) / n


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
    route: str = "pattern"  # how the rows were reduced: "qk" (from hook_q/hook_k) or "pattern"
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

    def _update_chunk(self, layer: int, p: torch.Tensor) -> None:
        # p: [batch head n n]
        if p.dtype not in (torch.float32, torch.float64):
            p = p.float()  # eps=1e-10 vanishes in half precision; one chunk at a time
        ent, max_prob = row_entropy_and_max(p, with_max=self.evidence)  # [batch head n] each
        rows = {"entropy": ent}
        if self.evidence:
            subdiag = p.new_zeros(ent.shape)
            subdiag[..., 1:] = p.diagonal(offset=-1, dim1=-2, dim2=-1)
            rows.update(max_prob=max_prob, first=p[..., 0], diag=p.diagonal(dim1=-2, dim2=-1),
                        subdiag=subdiag)
        self.add_rows(layer, rows)

    def update_qk(self, layer: int, q: torch.Tensor, k: torch.Tensor, scale: float) -> None:
        """Add one layer from its q and k [batch pos head d_head] (`probes.qk_rows`: the pattern
        softmax(q k^T / scale + causal mask) is reduced block by block, never formed)."""
        if not self.sums:
            self._init(q.device)
        self.add_rows(layer, qk_row_stats(q, k, scale, evidence=self.evidence))

    def add_rows(self, layer: int, rows: dict[str, torch.Tensor]) -> None:
        """Add per-row statistics name -> [batch head n] (row i sees keys 0..i) to the sums."""
        s, dev = self.sums[layer], self.sums[layer]["entropy"].device
        ent = rows["entropy"]
        n = ent.shape[-1]
        s["nonfinite"] += (~torch.isfinite(ent)).sum(dim=(0, 2)).to(dev, torch.float64)
        ent = ent.to(dev, torch.float64)
        s["entropy"] += ent.sum(dim=(0, 2))
        self.pos_sum[layer][:, :n] += ent.sum(dim=0)
        if n > 1:
            s["normalized"] += (ent[..., 1:] / log_keys(n, dev)[1:]).sum(dim=(0, 2))
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
QK_MIN_CONTEXT = 256  # "auto" reduces longer windows from q and k


def collect_stats(model: Any, tokens: torch.Tensor | Iterable[torch.Tensor], *,
                  layers: Sequence[int] | None = None, batch_size: int = 16,
                  progress: bool | None = None, evidence: bool = True, route: str = "auto") -> PatternStats:
    """Run the model (in eval mode) over the tokens with reducing hooks on each wanted layer;
    every hook is removed afterwards, also when the forward pass raises.

    route "qk" reduces each layer blockwise from hook_q / hook_k (`probes.qk_rows`: no
    [batch head n n] tensor, the model stays on its fused attention path); "pattern" from
    hook_pattern; "auto" takes "qk" when a check on a short window shows that the model's
    pattern is softmax(q k^T / scale + causal mask), "pattern" otherwise or for windows of at
    most QK_MIN_CONTEXT tokens (there the model's explicit path costs little and the pattern
    route is the faster: `benchmarks/bench_entropy.py`)."""
    if route not in ROUTES:
        raise ValueError(f"route must be one of {ROUTES}, got {route!r}")
    dims = require_attention(model)
    layers = list(range(dims.n_layers)) if layers is None else list(layers)
    for layer in layers:
        check_layer_head(dims, layer, None)
    batches = as_batches(tokens, dims.n_ctx, dims.d_vocab, batch_size)
    longest = max(b.shape[1] for b in batches)
    stats = PatternStats(layers, dims.n_heads, longest, evidence=evidence)
    if route == "auto" and longest <= QK_MIN_CONTEXT:
        route = "pattern"
    device = model_device(model)
    was_training = model.training
    model.eval()  # dropout off; the mode is put back afterwards
    try:
        scale = None
        if route != "pattern":
            scale = qk_path_scale(model, batches[0].to(device), layers)
            if scale is None and route == "qk":
                raise ProbeInputError("this model's attention pattern is not softmax(q k^T / scale + causal "
                                      "mask) of its hook_q / hook_k: use the pattern route")
        stats.route = "pattern" if scale is None else "qk"
        fwd_hooks = pattern_hooks(stats, layers) if scale is None else qk_hooks(stats, layers, scale)
        with torch.inference_mode(), model.hooks(fwd_hooks=fwd_hooks):  # removed even on errors
            for batch in progress_bar(batches, progress, "attention"):
                model(batch.to(device))
                stats.add_batch(*batch.shape)
    finally:
        model.train(was_training)
    return stats


def pattern_hooks(stats: PatternStats, layers: list[int]) -> list[tuple[str, Any]]:
    def hook_for(layer: int):
        def hook(pattern: torch.Tensor, hook: Any) -> None:  # pattern: [batch head q k]
            stats.update(layer, pattern.detach())
        return hook
    return [(f"blocks.{l}.attn.hook_pattern", hook_for(l)) for l in layers]


@dataclass
class EntropyResult:
    """Entropy grids over the reported layers and heads (`layers`, `heads` give their indices)."""

    model: str
    layers: list[int]
    heads: list[int]
    entropy: list[list[float]]  # [layer][head], nats, series-compatible
    entropy_normalized: list[list[float]]  # [layer][head], 0..1
    tokens: int
    windows: int
    per_position: list[list[list[float]]] | None = None  # [layer][head][pos], nats
    source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "tokens": self.tokens, "windows": self.windows,
                               "layers": self.layers, "heads": self.heads, "entropy": self.entropy,
                               "entropy_normalized": self.entropy_normalized}
        if self.per_position is not None:
            out["per_position"] = self.per_position
        if self.source is not None:
            out["source"] = self.source
        return to_jsonable(out)

    def nonfinite_layers(self) -> list[int]:
        """Layers with a head whose entropy is NaN or inf (a diverged model)."""
        return [l for l, row in zip(self.layers, self.entropy) if not all(math.isfinite(h) for h in row)]

    def series_display(self, grid: list[list[float]] | None = None) -> str:
        """The series' log shape: {0: [0.69, 0.158, 1.011, 0.861], 1: [...]}."""
        grid = self.entropy if grid is None else grid
        return repr({l: [round(v, 3) for v in row] for l, row in zip(self.layers, grid)})

    def format(self) -> str:
        lines = [f"model: {self.model}", f"measured on {self.tokens} tokens in {self.windows} window(s)"
                 + (f" ({self.source})" if self.source else ""),
                 "attention entropy (nats, series mean over all rows):", self.series_display(),
                 "normalised entropy H_i / ln(k_i) (1 = uniform, 0 = one-hot):",
                 format_table(self.layers, self.heads, self.entropy_normalized)]
        if self.per_position is not None:
            lines.append("entropy per query position (nats):")
            for l, row in zip(self.layers, self.per_position):
                for h, profile in zip(self.heads, row):
                    lines.append(f"L{l}H{h}: " + " ".join(f"{v:.2f}" for v in profile))
        return "\n".join(lines)


def format_table(layers: list[int], heads: list[int], grid: list[list[Any]], width: int = 8) -> str:
    """A layer x head table; floats with 3 decimals, anything else as text."""
    cell = lambda v: f"{v:{width}.3f}" if isinstance(v, float) else f"{str(v):>{width}}"  # noqa: E731
    rows = ["layer " + "".join(f"{'head ' + str(h):>{width}}" for h in heads)]
    rows += [f"{l:>5} " + "".join(cell(v) for v in row) for l, row in zip(layers, grid)]
    return "\n".join(rows)


def select(grid: torch.Tensor, heads: list[int]) -> list[list[float]]:
    """A [layer head ...] tensor restricted to some heads, as nested lists."""
    return grid[:, heads].tolist()


def run(model: Any, tokens: torch.Tensor | Iterable[torch.Tensor], *, layer: int | None = None,
        head: int | None = None, per_position: bool = False, batch_size: int = 16,
        progress: bool | None = None, name: str | None = None, source: str | None = None,
        route: str = "auto", tokenizer: Any = None) -> EntropyResult:
    """Entropy per layer and head of `model` (ours or a TransformerBridge) on [batch pos] tokens.

    Long rows are windowed to the model's context; `layer`/`head` restrict the report (and only
    the chosen layer is hooked); `per_position` adds the mean entropy at each query position;
    `route` is how patterns are reduced (`collect_stats`: "auto", "qk" or "pattern").
    `tokens` may be text, read with `tokenizer` (default `model.tokenizer`) as `--text` is.
    """
    tokens = tokens_or_text(model, tokens, tokenizer, batch_size)
    dims = require_attention(model)
    check_layer_head(dims, layer, head)
    layers = list(range(dims.n_layers)) if layer is None else [layer]
    heads = list(range(dims.n_heads)) if head is None else [head]
    stats = collect_stats(model, tokens, layers=layers, batch_size=batch_size, progress=progress,
                          evidence=False, route=route)
    return EntropyResult(
        model=name or describe_model(model), layers=layers, heads=heads,
        entropy=select(stats.mean("entropy"), heads),
        entropy_normalized=select(stats.mean("normalized"), heads),
        tokens=stats.tokens, windows=stats.windows, source=source,
        per_position=select(stats.per_position(), heads) if per_position else None)


def head_pattern(model: Any, tokens: torch.Tensor, layer: int, head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One head's attention pattern on one window and each query row's entropy.

    tokens: [1 pos] (pos <= n_ctx). Returns (pattern [q k], row entropy [q] in nats), float64
    on the CPU: what a heatmap of the head shows.
    """
    dims = require_attention(model)
    check_layer_head(dims, layer, head)
    (window,) = as_batches(tokens[:1], dims.n_ctx, dims.d_vocab)[:1]  # [1 pos]
    kept: dict[str, torch.Tensor] = {}

    def keep(pattern: torch.Tensor, hook: Any) -> None:  # [batch head q k]
        kept["p"] = pattern[0, head].detach().double().cpu()

    with torch.no_grad():
        model.run_with_hooks(window.to(model_device(model)),
                             fwd_hooks=[(f"blocks.{layer}.attn.hook_pattern", keep)])
    pattern = kept["p"]  # [q k]
    return pattern, attention_entropy(pattern)


def describe_model(model: Any) -> str:
    d = require_attention(model)
    return f"{type(model).__name__}(n_layers={d.n_layers}, n_heads={d.n_heads}, n_ctx={d.n_ctx})"


# ---------------------------------------------------------------- CLI

def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--layer", type=int, help="report only this layer (0-based)")
    parser.add_argument("--head", type=int, help="report only this head (0-based)")


def build_parser() -> argparse.ArgumentParser:
    from models.checkpoint import add_ckpt_arguments
    parser = argparse.ArgumentParser(prog="python -m probes.entropy", description=__doc__.splitlines()[0])
    add_ckpt_arguments(parser)
    add_input_arguments(parser)
    add_report_arguments(parser)
    parser.add_argument("--per-position", action="store_true",
                        help="also report the mean entropy at each query position")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        from models.checkpoint import load_from_args
        snap = load_from_args(args)
        dims = require_attention(snap.model)
        check_layer_head(dims, args.layer, args.head)
        batches, source = token_batches(args, snap.tokenizer, dims.n_ctx)
        result = run(snap.model, batches, layer=args.layer, head=args.head,
                     per_position=args.per_position, batch_size=args.batch_size,
                     progress=args.progress, name=str(snap.name), source=source)
        if args.json:
            print_json(result.to_dict())
        else:
            print(result.format())
        bad = result.nonfinite_layers()
        if bad:
            print(f"warning: attention in layer(s) {', '.join(map(str, bad))} is NaN or inf: the "
                  "model diverged there (JSON shows null)", file=sys.stderr)
        return 0

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
