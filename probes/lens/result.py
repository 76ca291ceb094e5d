"""The logit lens's result (`probes.logit_lens.run`, and the lens a snapshot of any model saved):
per-layer averages, per-position detail and top-k built on demand, the CLI's table and `--json`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from models.cli import to_jsonable
from models.tokenizers import token_piece
from probes.lens.stats import LayerStats

__all__ = ["LogitLensResult", "NOT_FINITE"]

NOT_FINITE = "(NaN)"  # shown instead of a top token where a layer's distribution is not finite


def _mean(parts: list[torch.Tensor]) -> float:
    count = sum(p.numel() for p in parts)
    return float(sum(p.double().sum() for p in parts) / count) if count else float("nan")


@dataclass
class LogitLensResult:
    """Per-layer averages as properties; per-position detail and top-k built on demand.

    `batches` holds (tokens [batch pos], [LayerStats per layer]) per forward pass; sequences are
    the rows of all batches in order.
    """

    layers: list[str]
    batches: list[tuple[torch.Tensor, list[LayerStats]]]
    readout_error: float  # max |lens at the last layer - model logits|
    tokenizer: Any = None
    source: str | None = None

    def _field(self, layer: int, name: str) -> list[torch.Tensor]:
        return [getattr(stats[layer], name) for _, stats in self.batches]

    @property
    def kl_to_final(self) -> list[float]:
        return [_mean(self._field(l, "kl")) for l in range(len(self.layers))]

    @property
    def cross_entropy(self) -> list[float]:
        return [_mean(self._field(l, "cross_entropy")) for l in range(len(self.layers))]

    @property
    def target_rank(self) -> list[float]:
        return [_mean(self._field(l, "rank")) for l in range(len(self.layers))]

    def per_position(self, name: str) -> list[list[list[Any]]]:
        """[layer][sequence][pos]; cross_entropy and rank hold None at each sequence's last position."""
        pad = [] if name == "kl" else [None]
        return [[row + pad for part in self._field(l, name) for row in part.tolist()]
                for l in range(len(self.layers))]

    @property
    def nonfinite_layers(self) -> list[str]:
        """Labels of the layers whose logits hold NaN or inf at some position."""
        return [label for l, label in enumerate(self.layers)
                if not all(bool(part.all()) for part in self._field(l, "finite"))]

    @property
    def tokens(self) -> list[list[int]]:
        return [row for toks, _ in self.batches for row in toks.tolist()]

    def piece(self, i: int) -> str | None:
        return token_piece(self.tokenizer, i)

    def top_k(self) -> list[list[list[list[dict[str, Any]]]]]:
        """[layer][sequence][pos] -> [{id, piece, prob}] best first; [] where the layer's
        distribution is not finite (NaN logits have no top token)."""
        out = []
        for l in range(len(self.layers)):
            seqs = []
            for probs, ids, ok in zip(*(self._field(l, f) for f in ("top_probs", "top_ids", "finite"))):
                for p_row, i_row, ok_row in zip(probs.tolist(), ids.tolist(), ok.tolist()):
                    seqs.append([[{"id": i, "piece": self.piece(i), "prob": p} for p, i in zip(ps, is_)]
                                 if fine else [] for ps, is_, fine in zip(p_row, i_row, ok_row)])
            out.append(seqs)
        return out

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable({
            "layers": self.layers, "tokens": self.tokens,
            "pieces": [[self.piece(i) for i in row] for row in self.tokens],
            "kl_to_final": self.kl_to_final, "kl_to_final_per_position": self.per_position("kl"),
            "cross_entropy": self.cross_entropy,
            "cross_entropy_per_position": self.per_position("cross_entropy"),
            "target_rank": self.target_rank, "target_rank_per_position": self.per_position("rank"),
            "top_k": self.top_k(), "readout_error": self.readout_error, "source": self.source})

    def format(self, columns: int = 8, max_sequences: int = 4) -> str:
        """Per-layer table, then a layer x position grid of top-1 tokens (`*` = the true next
        token) per sequence, `columns` positions per block, then the top-k at the last position."""
        source = f" ({self.source})" if self.source else ""
        lines = [f"logit lens on {len(self.tokens)} sequence(s){source}",
                 f"{'layer':<8}{'KL(final||layer)':>18}{'CE(next)':>10}{'rank(next)':>12}"]
        for row in zip(self.layers, self.kl_to_final, self.cross_entropy, self.target_rank):
            lines.append(f"{row[0]:<8}" + "".join(f"{v:>{w}.3f}" for v, w in zip(row[1:], (18, 10, 12))))
        top = self.top_k()
        for s, toks in enumerate(self.tokens[:max_sequences]):
            for start in range(0, len(toks), columns):
                lines += ["", f"sequence {s}, positions {start}..{min(start + columns, len(toks)) - 1}"]
                lines += self._grid_block(top, s, toks, range(start, min(start + columns, len(toks))))
            lines.append(f"top-{self.batches[0][1][0].top_ids.shape[-1]} at the last position:")
            for label, layer in zip(self.layers, top):
                lines.append(f"{label:<8}" + ("  ".join(f"{self._show(e['id'])} {e['prob']:.2f}"
                                                        for e in layer[s][-1]) or NOT_FINITE))
        if len(self.tokens) > max_sequences:
            lines.append(f"({len(self.tokens) - max_sequences} more sequence(s) in --json)")
        return "\n".join(lines)

    def _show(self, i: int, width: int = 8) -> str:
        piece = self.piece(i)
        return (repr(piece) if piece is not None else f"#{i}")[:width]

    def _grid_block(self, top: list, s: int, toks: list[int], positions: range) -> list[str]:
        cell = 14
        nxt = [toks[p + 1] if p + 1 < len(toks) else None for p in positions]
        lines = [f"{'input':<8}" + "".join(f"{self._show(toks[p]):<{cell}}" for p in positions),
                 f"{'next':<8}" + "".join(f"{self._show(n) if n is not None else '-':<{cell}}" for n in nxt)]
        for label, layer in zip(self.layers, top):
            cells = []
            for p, n in zip(positions, nxt):
                if not layer[s][p]:
                    cells.append(NOT_FINITE.ljust(cell))
                    continue
                best = layer[s][p][0]
                mark = "*" if best["id"] == n else " "
                cells.append(f"{self._show(best['id'])} {best['prob']:.2f}{mark}".ljust(cell))
            lines.append((f"{label:<8}" + "".join(cells)).rstrip())
        return [line.rstrip() for line in lines]
