"""What a snapshot of any model saved (`models.store.any_files`: the model's attention patterns and
its logit lens on a fixed sample of the eval tokens, read at save time) as the probes read it,
where the model's code is not at hand (`models.store.any_model.SavedModel`).

- `SavedSource`: the fourth kind of attention source (`probes.sources.attention`): its dims, the
  windows the Monitor saw, and the patterns of any batch whose rows are rows of the saved sample
  or of the saved random repeat (or their first positions: a causal pattern of the first n
  positions is the saved one's first n rows and keys). With no tokens, `batches` hands back the
  saved sample; other tokens are refused in one line saying how to give the model's code.
- `saved_lens_result(model, tokens, k=...)`: the logit lens saved for those rows, as
  `probes.logit_lens.run` returns it.
(`probes.common` has `saved_sample(snap)`, the sample's tokens and one line describing it, and
`refused(model)`, the one line for other text, which the CLIs use before any source is made.)
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from models.store.any_model import SavedModel
from probes.common import refused
from probes.errors import ProbeInputError
from probes.sources.attention import AttentionSource, ModelDims, Reduce, stop_after

__all__ = ["SavedSource", "saved_lens", "saved_lens_result"]

LENS_FIELDS = ("kl", "cross_entropy", "rank", "top_probs", "top_ids", "finite")


def rows_of(saved: torch.Tensor, batch: torch.Tensor) -> list[int] | None:
    """For each row of batch [b n], a row of saved [R T] whose first n tokens it is; None if one has none."""
    if batch.shape[1] > saved.shape[1]:
        return None
    found = []
    for row in batch.cpu():
        same = (saved[:, :len(row)] == row).all(-1).nonzero()
        if not len(same):
            return None
        found.append(int(same[0]))
    return found


class SavedSource(AttentionSource):
    """The patterns a snapshot of any model saved; see the module's docstring."""

    kind = "saved"

    def __init__(self, model: SavedModel):
        readings, info = model.readings(), model.meta["readings"]
        layers = sorted(int(k.rsplit(".", 1)[1]) for k in readings if k.startswith("sample.pattern."))
        if not layers:
            why = info.get("patterns") or "none were saved"
            raise ProbeInputError(f"{model.architecture}'s snapshot holds no attention patterns: {why}")
        heads = {readings[f"sample.pattern.{l}"].shape[1] for l in layers}
        if len(heads) > 1:
            raise ProbeInputError(f"{model.architecture}'s attention layers have {sorted(heads)} heads: the probes "
                                  "read models whose layers have the same number of heads")
        self.saved_model, self.name, self.device = model, model.architecture, torch.device("cpu")
        sample = readings["sample.tokens"]  # [rows pos]
        self.dims = ModelDims(len(layers), heads.pop(), int(sample.shape[1]), int(model.meta["model"]["d_vocab"]))
        self.windows = {int(l): int(w) for l, w in (info.get("windows") or {}).items()}
        self.sets = [(readings[f"{kind}.tokens"], [readings[f"{kind}.pattern.{l}"] for l in layers])
                     for kind in ("sample", "repeat") if f"{kind}.tokens" in readings]
        repeat = info.get("repeat")
        self.fixed_repeat = (readings["repeat.tokens"], int(repeat["length"])) if repeat else None

    def batches(self, tokens: Any, batch_size: int = 16) -> list[torch.Tensor]:
        if tokens is None:
            return list(torch.split(self.sets[0][0], max(1, batch_size)))
        return super().batches(tokens, batch_size)

    def patterns_of(self, batch: torch.Tensor) -> list[torch.Tensor]:
        """Each layer's saved pattern [batch head q k] for the batch's rows, or the one-line refusal."""
        n = batch.shape[1]
        for tokens, patterns in self.sets:
            rows = rows_of(tokens, batch)
            if rows is not None:
                return [p[rows][:, :, :n, :n] for p in patterns]
        raise refused(self.saved_model)

    def each_layer_pattern(self, batch: torch.Tensor, layers: Iterable[int], reduce: Reduce) -> int:
        patterns = self.patterns_of(batch)
        take, done = stop_after(list(layers), reduce)
        for layer, pattern in enumerate(patterns):
            if take(layer, pattern):
                break
        return done[0]


def saved_lens_result(model: SavedModel, tokens: Any, *, k: int = 5, include_mid: bool = False, tokenizer: Any = None,
                      batch_size: int = 16, source: str | None = None) -> Any:
    """`probes.logit_lens.run`'s result from the lens the snapshot saved (tokens None: its sample)."""
    from probes.common import as_batches, model_tokenizer, text_ids
    from probes.lens.result import LogitLensResult

    if include_mid:
        raise ProbeInputError(f"{model.architecture}'s snapshot saved the lens after each block only (leave out --mid)")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ProbeInputError(f"k must be a positive int, got {k!r}")
    info = model.meta["readings"]
    tokens = text_ids(model, tokens, tokenizer)
    tokens = model.readings()["sample.tokens"] if tokens is None else tokens
    batches = as_batches(tokens, int(info["positions"]), int(model.meta["model"]["d_vocab"]), batch_size)
    per_batch = saved_lens(model, batches, k)
    return LogitLensResult(list(info["lens"]["points"]), per_batch, float(info["lens"]["readout_error"]),
                           model_tokenizer(model, tokenizer), source)


def saved_lens(model: SavedModel, batches: list[torch.Tensor], k: int) -> list[tuple[torch.Tensor, list[Any]]]:
    """(tokens, [LayerStats per point]) per batch from the lens saved for its rows."""
    from probes.lens.stats import LayerStats

    readings, info = model.readings(), model.meta["readings"]
    lens = info.get("lens")
    if not isinstance(lens, dict):
        raise ProbeInputError(f"{model.architecture}'s snapshot holds no logit lens: {lens or 'none was saved'}")
    if k > int(info.get("lens_k") or 0):
        raise ProbeInputError(f"-k {k}: the snapshot saved the top {info.get('lens_k')} tokens of each lens cell")
    saved = readings["sample.tokens"]
    out = []
    for batch in batches:
        rows, n = rows_of(saved, batch), batch.shape[1]
        if rows is None:
            raise refused(model)
        cut = {"kl": n, "finite": n, "cross_entropy": n - 1, "rank": n - 1, "top_probs": n, "top_ids": n}
        fields = {f: readings[f"lens.{f}"][:, rows, :cut[f]] for f in LENS_FIELDS}  # [point batch pos ...]
        fields["top_probs"], fields["top_ids"] = fields["top_probs"][..., :k], fields["top_ids"][..., :k]
        fields["finite"] = fields["finite"].bool()
        out.append((batch.cpu(), [LayerStats(*(fields[f][p] for f in LENS_FIELDS))
                                  for p in range(len(lens["points"]))]))
    return out
