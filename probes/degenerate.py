"""Degenerate attention: a verdict per head with the numbers behind it, and, for a training run,
when each head's entropy collapsed, went uniform or went NaN.

    from probes import degenerate
    result = degenerate.run(model, tokens)       # ours, a TransformerBridge, or any nn.Module (the tap)
    result.verdicts[layer][head]                 # 'healthy', 'previous', 'sink', ...
    degenerate.entropy_timeline(read_metrics(run_dir), n_ctx=128)

Verdicts, first match wins (most specific first; the evidence numbers are means over rows with
two or more visible keys, since row 0 of a causal head is always one-hot on itself):
`diverged` NaN/inf in the head's pattern or weights; `sink` most mass on the first position;
`self` / `previous` one-hot onto the diagonal / sub-diagonal; `collapsed` one-hot onto anything
else; `uniform` normalised entropy near 1 (the head averages and does nothing); else `healthy`.

Evidence per head: `entropy` (series mean, nats), `normalized_entropy`, `max_prob` (mean of each
row's largest probability), `first_mass` / `diag_mass` / `subdiag_mass` (mean p[i, 0], p[i, i],
p[i, i-1]), `sink_score` (Gu et al. 2024: mean p[i, 0] over *all* rows, row 0 included as in the
paper, so short windows inflate it: uniform attention over T rows scores H_T / T, 0.34 at T = 8),
`nonfinite_rows`, `weights_finite` (None when the model's per-head weights cannot be read).
"""

from __future__ import annotations

if __name__ == "__main__":  # Ctrl-C/SIGTERM: one line from here on; --help and bad arguments
    from models.interrupts import quiet_signals  # answered before torch is imported (~4 s)
    quiet_signals()
    from probes.args import degenerate_parser
    degenerate_parser().parse_early()

import argparse
import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Any, Iterable

import torch

from probes.args import degenerate_parser as build_parser
from probes.cli import Shown, run_probe
from probes.common import ProbeInputError, per_query_head, text_ids, to_jsonable, token_batches
from probes.entropy import PatternStats, collect_stats, format_table
from probes.sources import snapshot_source, source_of
from probes.thresholds import Thresholds
from probes.timeline import (Timeline, attn_entropy_grid, entropy_timeline,  # noqa: F401 (re-exported)
                             stayed_from)

log = logging.getLogger(__name__)

VERDICTS = ("diverged", "sink", "self", "previous", "collapsed", "uniform", "healthy")
ONE_HOT_VERDICTS = ("sink", "self", "previous", "collapsed")
EVIDENCE = ("entropy", "normalized_entropy", "max_prob", "first_mass", "diag_mass", "subdiag_mass",
            "sink_score", "nonfinite_rows", "weights_finite")


# ---------------------------------------------------------------- pure functions

def is_one_hot(ev: dict[str, float], t: Thresholds) -> bool:
    return ev["normalized_entropy"] < t.collapse_entropy or ev["max_prob"] > t.collapse_max_prob


def verdict(ev: dict[str, Any], t: Thresholds = Thresholds()) -> str:
    """One head's verdict from its evidence (keys as in EVIDENCE); the most specific wins."""
    if ev["nonfinite_rows"] > 0 or ev["weights_finite"] is False or not all(
            math.isfinite(ev[k]) for k in ("normalized_entropy", "max_prob", "first_mass")):
        return "diverged"
    if ev["first_mass"] > t.sink_mass:
        return "sink"
    if ev["diag_mass"] > t.one_hot_mass:
        return "self"
    if ev["subdiag_mass"] > t.one_hot_mass:
        return "previous"
    if is_one_hot(ev, t):
        return "collapsed"
    if ev["normalized_entropy"] > t.uniform_entropy:
        return "uniform"
    return "healthy"


def evidence_grids(stats: PatternStats, weights_finite: torch.Tensor | None) -> dict[str, list[list[Any]]]:
    """Every evidence number as a [layer][head] grid over the hooked layers and all heads."""
    grids = {"entropy": stats.mean("entropy"), "normalized_entropy": stats.mean("normalized"),
             "max_prob": stats.mean("max_prob"), "first_mass": stats.mean("first"),
             "diag_mass": stats.mean("diag"), "subdiag_mass": stats.mean("subdiag"),
             "sink_score": stats.mean("first_all")}
    out: dict[str, list[list[Any]]] = {k: v.tolist() for k, v in grids.items()}
    out["nonfinite_rows"] = stats.count("nonfinite").long().tolist()
    shape = (len(stats.layers), stats.n_heads)
    out["weights_finite"] = (weights_finite.tolist() if weights_finite is not None
                             else [[None] * shape[1] for _ in range(shape[0])])
    return out


def head_evidence(grids: dict[str, list[list[Any]]], i: int, h: int) -> dict[str, Any]:
    return {name: grids[name][i][h] for name in EVIDENCE}


def head_weights_finite(model: Any, layers: list[int], n_heads: int) -> torch.Tensor | None:
    """[layer head] bool: are W_Q, W_K, W_V, W_O (and biases) of each head finite? None if unknown.

    Ours show per-head views (`blocks[l].attention.heads[h].W_Q`, `stacked`); TransformerLens models
    expose stacked `W_Q` [head d_model d_head] and `W_O` [head d_head d_model] on `blocks[l].attn`.
    """
    try:
        rows = []
        for layer in layers:
            block = model.blocks[layer]
            attn = getattr(block, "attention", None) or getattr(block, "attn")
            if hasattr(attn, "stacked"):  # ours
                names = [n for n in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V") if hasattr(attn.heads[0], n)]
                tensors = [attn.stacked(n) for n in names]
                if getattr(attn, "W_O", None) is not None:
                    tensors.append(attn.W_O.reshape(n_heads, -1, attn.W_O.shape[-1]))
            else:
                tensors = [getattr(attn, n) for n in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V")
                           if isinstance(getattr(attn, n, None), torch.Tensor)]
                tensors = [per_query_head(t, n_heads) for t in tensors if t.dim() > 1]
                tensors = [t for t in tensors if t.shape[0] == n_heads]
            if not tensors:
                return None
            rows.append(torch.stack([torch.isfinite(t.detach().reshape(n_heads, -1)).all(-1).cpu()
                                     for t in tensors]).all(0))
        return torch.stack(rows)  # [layer head]
    except (AttributeError, IndexError, TypeError, RuntimeError) as err:
        log.debug("cannot read per-head attention weights: %s", err)
        return None


# ---------------------------------------------------------------- the runner

@dataclass
class DegenerateResult:
    """Verdicts and evidence over the reported layers and heads (`layers`, `heads`)."""

    model: str
    layers: list[int]
    heads: list[int]
    verdicts: list[list[str]]  # [layer][head]
    evidence: dict[str, list[list[Any]]]  # name -> [layer][head]
    collapsed_layers: list[bool]  # per reported layer: every head one-hot
    sink_rate: float  # fraction of the measured heads with sink_score > thresholds.sink_score
    thresholds: dict[str, float]
    tokens: int
    windows: int
    source: str | None = None
    timeline: Timeline | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in dataclasses.asdict(self).items() if k != "timeline"}
        if self.source is None:
            out.pop("source")
        if self.timeline is not None:
            out["timeline"] = self.timeline.to_dict()
        return to_jsonable(out)

    def format(self) -> str:
        lines = [f"model: {self.model}", f"measured on {self.tokens} tokens in {self.windows} window(s)"
                 + (f" ({self.source})" if self.source else ""), "verdicts:",
                 format_table(self.layers, self.heads, self.verdicts, width=10)]
        for name in ("normalized_entropy", "max_prob", "first_mass", "diag_mass", "subdiag_mass", "sink_score"):
            lines += [f"{name}:", format_table(self.layers, self.heads, self.evidence[name], width=10)]
        collapsed = [l for l, c in zip(self.layers, self.collapsed_layers) if c]
        lines.append(f"whole-layer collapse: {', '.join(map(str, collapsed)) if collapsed else 'none'}")
        lines.append(f"sink rate (heads with sink_score > {self.thresholds['sink_score']}): {self.sink_rate:.2f}")
        if self.timeline is not None:
            lines.append(self.timeline.format())
        return "\n".join(lines)


def run(model: Any, tokens: torch.Tensor | Iterable[torch.Tensor], *, thresholds: Thresholds | None = None,
        layer: int | None = None, head: int | None = None, batch_size: int = 16,
        progress: bool | None = None, name: str | None = None, source: str | None = None,
        route: str = "auto", tokenizer: Any = None) -> DegenerateResult:
    """Verdict per head of `model` (ours, a TransformerBridge, any module mapping [batch pos] ids
    to logits, read through the attention tap, or an attention source) on [batch pos] tokens.

    Every head of the chosen layers is measured (whole-layer collapse needs them all);
    `layer` / `head` restrict what is reported; `route` as in `probes.entropy.collect_stats`.
    `tokens` may be text, read with `tokenizer` (default `model.tokenizer`) as `--text` is.
    """
    tokens = text_ids(model, tokens, tokenizer)
    t = thresholds or Thresholds()
    attn = source_of(model, tokens)
    layers, heads = attn.chosen(layer, head)
    stats = collect_stats(attn, tokens, layers=layers, batch_size=batch_size, progress=progress, route=route)
    if stats.multi_rows == 0:
        raise ProbeInputError("every window is one token long: a verdict needs rows with 2+ keys")
    n_heads = attn.dims.n_heads
    weights = None if attn.model is None else head_weights_finite(attn.model, layers, n_heads)
    grids = evidence_grids(stats, weights)
    all_verdicts = [[verdict(head_evidence(grids, i, h), t) for h in range(n_heads)]
                    for i in range(len(layers))]
    collapsed_layers = [all(v in ONE_HOT_VERDICTS and is_one_hot(head_evidence(grids, i, h), t)
                            for h, v in enumerate(row)) for i, row in enumerate(all_verdicts)]
    sinks = [s > t.sink_score for row in grids["sink_score"] for s in row]
    return DegenerateResult(
        model=name or attn.describe(), layers=layers, heads=heads,
        verdicts=[[row[h] for h in heads] for row in all_verdicts],
        evidence={k: [[row[h] for h in heads] for row in grid] for k, grid in grids.items()},
        collapsed_layers=collapsed_layers, sink_rate=sum(sinks) / len(sinks),
        thresholds=dataclasses.asdict(t), tokens=stats.tokens, windows=stats.windows, source=source)


# ---------------------------------------------------------------- CLI

def has_input(args: argparse.Namespace) -> bool:
    return any(getattr(args, k) is not None for k in ("text", "text_file", "data"))


def run_timeline(args: argparse.Namespace, dims: Any) -> Timeline:
    """The timeline of the run --ckpt names: its records checked as read, against the loaded
    model's layers and heads too; malformed ones skipped and counted."""
    from models.store.record_check import RunShape
    from models.store.run import read_metrics_log
    metrics = read_metrics_log(args.ckpt)
    return entropy_timeline(metrics.records, dims.n_ctx, args.timeline_collapse, args.timeline_uniform,
                            shape=RunShape(dims.n_layers, dims.n_heads), skipped=len(metrics.skipped))


def main(argv: list[str] | None = None) -> int:
    return run_probe(build_parser, argv, from_args)


def from_args(args: argparse.Namespace) -> Any:
    from models.checkpoint import is_run_dir, load_from_args
    t = Thresholds(args.collapse_entropy, args.collapse_max_prob, args.uniform_entropy,
                   args.sink_mass, args.one_hot_mass, args.sink_score)
    run_dir = args.ckpt is not None and is_run_dir(args.ckpt)
    read_text = has_input(args) or not run_dir  # a run and no input: its training timeline alone
    snap = load_from_args(args)
    attn = snapshot_source(snap)
    attn.check(args.layer, args.head)
    timeline = run_timeline(args, attn.dims) if run_dir else None
    if not read_text:
        return Shown(lambda: {"model": str(snap.name), "timeline": timeline.to_dict()},
                     lambda: f"model: {snap.name}\n{timeline.format()}")
    # with no input, the snapshot's own text (probes.run_text)
    batches, source = token_batches(args, snap.tokenizer, attn.dims.n_ctx, snap)
    result = run(attn, batches, thresholds=t, layer=args.layer, head=args.head,
                 batch_size=args.batch_size, progress=args.progress, name=str(snap.name), source=source)
    result.timeline = timeline
    return result


if __name__ == "__main__":
    from models.cli import exit_entry
    exit_entry(main())
