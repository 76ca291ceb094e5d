"""The result of a patching sweep: the metric on the clean and corrupt runs, on every patched run
in TransformerLens's layout, normalised, and how many forward passes it took."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from models.cli import to_jsonable

SHADES = " .:-=+*#%@"  # the terminal heat map, from 0 to 1 (clipped)


@dataclass
class Patching:
    what: str  # heads | resid | attn | mlp
    by_position: bool
    method: str  # exact | attribution
    direction: str  # denoise | noise
    metric: str  # logit_diff | logprob | the callable's name
    clean: float  # the metric on the clean run
    corrupt: float  # ... and on the corrupt one
    patched: torch.Tensor  # [layer pos head] | [layer head] | [layer pos] | [layer]
    forwards: int  # forward passes run (batched patches count one per batch; attribution: 2, + 1 backward)
    axes: list[str]  # the layout's axis names, e.g. ["layer", "pos", "head"]
    clean_tokens: list[list[int]]
    corrupt_tokens: list[list[int]]
    pieces: list[str | None] = field(default_factory=list)  # the corrupt run's first row, for labels
    atp_star: bool = False
    correlation: float | None = None  # with exact patching, where both ran (`with_correlation`)
    _rerun: Callable[[tuple[int, ...]], torch.Tensor] | None = field(default=None, repr=False, compare=False)
    _tokenizer: Any = field(default=None, repr=False, compare=False)

    @property
    def normalised(self) -> torch.Tensor:
        """(patched - corrupt) / (clean - corrupt), in both directions: 1 where a patch gives the
        clean run's metric, 0 where it gives the corrupt one's (NaN if the two runs agree)."""
        gap = self.clean - self.corrupt
        if gap == 0:
            return torch.full_like(self.patched, float("nan"))
        return (self.patched - self.corrupt) / gap

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable({
            "what": self.what, "by_position": self.by_position, "method": self.method,
            "direction": self.direction, "metric": self.metric, "atp_star": self.atp_star,
            "axes": self.axes, "clean": self.clean, "corrupt": self.corrupt, "patched": self.patched,
            "normalised": self.normalised, "forwards": self.forwards, "correlation": self.correlation,
            "clean_tokens": self.clean_tokens, "corrupt_tokens": self.corrupt_tokens, "pieces": self.pieces})

    def top_predictions(self, index: tuple[int, ...] | int, k: int = 5, row: int = 0) -> list[dict[str, Any]]:
        """The patched run's top-k next tokens at the last position (batch row `row`), for the
        cell at `index` into `patched` (exact patching of that one cell, whatever the method):
        [{"id", "piece", "prob", "logit"}]."""
        if self._rerun is None:
            raise ValueError("this result has no model to run the patch on (it was read from JSON)")
        index = (index,) if isinstance(index, int) else tuple(index)
        logits = self._rerun(index)[row, -1].float()  # [vocab]
        probs = logits.softmax(-1)
        top = probs.topk(min(k, probs.numel()))
        from models.tokenizers import token_piece
        return [{"id": int(i), "piece": token_piece(self._tokenizer, int(i)), "prob": float(p),
                 "logit": float(logits[i])} for p, i in zip(top.values, top.indices)]

    def grid_rows(self) -> list[tuple[str, torch.Tensor]]:
        """The heat map's rows: (label, values): a row per layer and head over positions for heads by
        position, else a row per layer (over heads, positions, or one cell)."""
        norm = self.normalised
        if self.axes == ["layer", "pos", "head"]:
            return [(f"L{l}H{h}", norm[l, :, h]) for l in range(norm.shape[0]) for h in range(norm.shape[2])]
        return [(f"L{l}", norm[l].reshape(-1)) for l in range(norm.shape[0])]

    def format(self) -> str:
        """A table of the largest effects and a heat map of `normalised` (layer down the side)."""
        norm = self.normalised
        lines = [f"{self.method} patching ({self.direction}) of {self.what}"
                 f"{' by position' if self.by_position else ''}: {self.metric} clean {self.clean:.4f}, "
                 f"corrupt {self.corrupt:.4f}; {self.forwards} forward passes"
                 + (f"; correlation with exact {self.correlation:.3f}" if self.correlation is not None else "")]
        flat = norm.flatten()
        order = flat.nan_to_num(0).abs().argsort(descending=True)[:10]
        lines.append("largest normalised effects (1 = the clean run's metric, 0 = the corrupt one's):")
        for i in order.tolist():
            index = list(torch.unravel_index(torch.tensor(i), norm.shape))
            where = " ".join(f"{a} {int(v)}" for a, v in zip(self.axes, index))
            lines.append(f"  {where:<26}{float(flat[i]):>9.3f}   metric {float(self.patched.flatten()[i]):.4f}")
        lines += ["", f"heat map of the normalised effect ('{SHADES}' = 0 .. 1, '?' undefined):"]
        by_pos = "pos" in self.axes
        if by_pos and self.pieces:
            lines.append("  " + " " * 6 + "".join(label_char(p) for p in self.pieces))
        for label, row in self.grid_rows():
            lines.append(f"  {label:<6}" + "".join(shade(v) for v in row.tolist()))
        return "\n".join(lines)


def label_char(piece: str | None) -> str:
    """One character standing for a token in the heat map's header."""
    text = (piece or "?").replace("\u0120", " ").replace("\u010a", "\n")
    return {"\n": "\u00b6", "\t": "\u2192", "": "?"}.get(text[:1], text[:1])


def shade(value: float) -> str:
    if value != value:  # NaN
        return "?"
    return SHADES[min(len(SHADES) - 1, max(0, int(round(value * (len(SHADES) - 1)))))]
