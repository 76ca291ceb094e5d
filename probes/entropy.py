"""Attention entropy per layer and head, as the series logged it, and normalised.

    from probes import entropy
    result = entropy.run(model, tokens)          # ours, a TransformerBridge, or any nn.Module (the tap)
    print(result.series_display())               # {0: [0.69, 0.158, 1.011, 0.861], ...}
    result.to_dict()                             # == python -m probes.entropy ... --json

Definitions (DESIGN.md, "Probes"): for row i of a head's causal pattern p,
`H_i = -sum_j p_ij ln(p_ij + 1e-10)` over the keys row i may see. `entropy` is the series'
`-(p * (p + 1e-10).log()).sum(-1).mean()`: the mean over every window and *every* row, row 0
(always one-hot, H = 0) included, in nats. `entropy_normalized` is the mean of `H_i / ln(k_i)`
over rows with at least two keys, k_i the keys row i may see: i + 1, or min(i + 1, w) in a layer
with a sliding window of w keys (the source's `windows`): 1 = uniform, 0 = one-hot.

The runner (`probes.rows.stats.collect_stats`) reduces each layer inside its hooks to per-head
sums, from hook_q / hook_k on long windows (`probes.rows.qk`: no [batch head n n] pattern) or from
hook_pattern, so memory stays at about one layer's attention. `PatternStats` also holds what
`probes.degenerate` needs (max probability, mass on the first position, diagonal and sub-diagonal).
"""

from __future__ import annotations

if __name__ == "__main__":  # Ctrl-C/SIGTERM: one line from here on; --help and bad arguments
    from models.interrupts import quiet_signals  # answered before torch is imported (~4 s)
    quiet_signals()
    from probes.args import entropy_parser
    entropy_parser().parse_early()

import logging
import math
from dataclasses import dataclass
from typing import Any, Iterable

import torch

from probes.args import entropy_parser as build_parser
from probes.cli import Shown, run_probe
from probes.common import text_ids, to_jsonable, token_batches
from probes.rows.stats import EPS, SUMS, PatternStats, collect_stats, log_keys  # noqa: F401 (re-exported)
from probes.sources import snapshot_source, source_of
from probes.timeline import uniform_series_entropy  # noqa: F401 (re-exported)

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- pure functions on patterns

def attention_entropy(pattern: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """Per-row entropy in nats, the series' formula: [... q k] -> [... q]."""
    return -(pattern * (pattern + eps).log()).sum(-1)


def series_entropy(pattern: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """The series' logged number per head: mean over batch and all rows. [batch head q k] -> [head]."""
    return attention_entropy(pattern, eps).mean(dim=(0, 2))


def normalized_entropy(pattern: torch.Tensor, eps: float = EPS, window: int | None = None) -> torch.Tensor:
    """H_i / ln(k_i) for rows 1..q-1 (k_i = i + 1 keys, min(i + 1, window) in a sliding-window
    layer; a window of one key leaves no row with two: NaN): [... q k] -> [... q-1]."""
    ent = attention_entropy(pattern, eps)[..., 1:]
    keys = log_keys(pattern.shape[-2], ent.device, window)[1:].to(ent.dtype)
    return (ent / keys).masked_fill(keys == 0, float("nan"))


# ---------------------------------------------------------------- the report

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


def run(model: Any, tokens: torch.Tensor | Iterable[torch.Tensor] | str, *, layer: int | None = None,
        head: int | None = None, per_position: bool = False, batch_size: int = 16,
        progress: bool | None = None, name: str | None = None, source: str | None = None,
        route: str = "auto", tokenizer: Any = None) -> EntropyResult:
    """Entropy per layer and head of `model` (ours, a TransformerBridge, any module mapping
    [batch pos] ids to logits through the tap, or an attention source) on [batch pos] tokens.

    Long rows are windowed to the model's context; `layer`/`head` restrict the report (and only
    the chosen layer is hooked); `per_position` adds the mean entropy at each query position;
    `route` is how patterns are reduced (`collect_stats`: "auto", "qk" or "pattern").
    `tokens` may be text, read with `tokenizer` (default `model.tokenizer`) as `--text` is.
    """
    tokens = text_ids(model, tokens, tokenizer)
    attn = source_of(model, tokens)
    layers, heads = attn.chosen(layer, head)
    stats = collect_stats(attn, tokens, layers=layers, batch_size=batch_size, progress=progress,
                          evidence=False, route=route, fused=not per_position)  # rows exact
    return EntropyResult(
        model=name or attn.describe(), layers=layers, heads=heads,
        entropy=select(stats.mean("entropy"), heads),
        entropy_normalized=select(stats.mean("normalized"), heads),
        tokens=stats.tokens, windows=stats.windows, source=source,
        per_position=select(stats.per_position(), heads) if per_position else None)


def head_pattern(model: Any, tokens: torch.Tensor, layer: int, head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One head's attention pattern on one window and each query row's entropy.

    tokens: [1 pos] (pos <= n_ctx). Returns (pattern [q k], row entropy [q] in nats), float64
    on the CPU: what a heatmap of the head shows.
    """
    attn = source_of(model, tokens)
    attn.check(layer, head)
    pattern = layer_patterns(attn, tokens, layer)[head]  # [q k]
    return pattern, attention_entropy(pattern)


def layer_patterns(model: Any, tokens: torch.Tensor, layer: int) -> torch.Tensor:
    """Every head's attention pattern in one layer on one window: the small multiples of a layer.

    tokens: [1 pos] (pos <= n_ctx; a longer row is cut to its first window). Returns
    [head q k] float64 on the CPU, `head_pattern(...)[0]` for each head from one forward pass
    that stops once the layer's pattern is kept (later blocks and the unembedding are not run);
    from the hook points of ours or a bridge, the attention tap on any other module, or any
    attention source given as `model`.
    """
    attn = source_of(model, tokens)
    attn.check(layer)
    (window,) = attn.batches(tokens[:1])[:1]  # [1 pos]
    kept: dict[str, torch.Tensor] = {}

    def keep(layer: int, pattern: torch.Tensor) -> None:  # [batch head q k]
        kept["p"] = pattern[0].detach().double().cpu()  # [head q k]

    with attn.reading():
        attn.each_layer_pattern(window.to(attn.device), [layer], keep)
    return kept["p"]


# ---------------------------------------------------------------- CLI

def cli_warnings(result: EntropyResult) -> list[str]:
    """What the CLI says below the table: a diverged layer, and windows of one token (whose one
    row sees one key: H / ln(1) is 0 / 0, so the normalised entropy is not a number)."""
    lines = []
    bad = result.nonfinite_layers()
    if bad:
        lines.append(f"attention in layer(s) {', '.join(map(str, bad))} is NaN or inf: the model diverged "
                     "there (JSON shows null)")
    if result.tokens == result.windows:
        lines.append("every window is one token long: its one row sees one key, which gives no normalised "
                     "entropy (H / ln 1 = 0 / 0: nan, JSON null; the entropy itself is 0); give 2+ tokens")
    return lines


def main(argv: list[str] | None = None) -> int:
    return run_probe(build_parser, argv, from_args)


def from_args(args: Any) -> Shown:
    from models.checkpoint import load_from_args
    snap = load_from_args(args)
    attn = snapshot_source(snap)
    attn.check(args.layer, args.head)
    batches, source = token_batches(args, snap.tokenizer, attn.dims.n_ctx, snap)
    result = run(attn, batches, layer=args.layer, head=args.head,
                 per_position=args.per_position, batch_size=args.batch_size,
                 progress=args.progress, name=str(snap.name), source=source)
    return Shown.of(result, warnings=cli_warnings(result))


if __name__ == "__main__":
    from models.cli import exit_entry
    exit_entry(main())
