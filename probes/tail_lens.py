"""The logit lens of any module (a GPT a user wrote, nanochat's): each block's output decoded by
the model's own final norm and unembedding, and whatever its forward does after the unembedding
(nanochat's softcap, a padded vocabulary cut), without hook points of ours.

    stats, readout_error = lens_batch(model, layout_of(model), ids, k=5)   # ids [batch pos]

Points: "embed" (what block 0 reads), then "N_post" (block N's output), as `probes.logit_lens`
labels them. A point's residual h [batch pos d_model] is decoded by running the model again with
the unembedding's input replaced by final_norm(h): the final norm a module (`ln_f`), a norm
without weights recomputed on h (`F.rms_norm`, `F.layer_norm`: `models.layout`), or nothing
where the unembedding reads the last block itself. The model's own logits are the final
distribution; `readout_error` is max |decoded last block - logits| (0 when the readout is final
norm + unembedding). One forward per point: a lens of any module costs n_layers + 2 forwards.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from models.layout import Layout, first_tensor
from models.tap import eval_pass, logits_of
from models.tap_inputs import forward_inputs
from probes.errors import ProbeInputError

__all__ = ["check_layout", "lens_batch", "point_labels"]


def point_labels(n_blocks: int) -> list[str]:
    return ["embed"] + [f"{l}_post" for l in range(n_blocks)]


def check_layout(model: Any, layout: Layout) -> None:
    """One line where the lens cannot read this model: no blocks, no unembedding, no final norm."""
    for part in ("blocks", "unembedding", "final_norm"):
        if not getattr(layout, part):
            raise ProbeInputError(f"the logit lens cannot read {type(model).__name__}: {layout.why_missing(part)}")


def residuals(model: torch.nn.Module, layout: Layout, ids: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """What block 0 reads and each block's output ([batch pos d_model] each), and the logits."""
    blocks = [model.get_submodule(name) for name in layout.blocks]
    kept: list[torch.Tensor | None] = [None] * (len(blocks) + 1)

    def before_first(module, args, kwargs):
        kept[0] = (args[0] if args else first_tensor(list(kwargs.values()))).detach()

    def after(i: int):
        def hook(module, args, output):
            kept[i + 1] = first_tensor(output).detach()
        return hook

    handles = [blocks[0].register_forward_pre_hook(before_first, with_kwargs=True)]
    handles += [block.register_forward_hook(after(i)) for i, block in enumerate(blocks)]
    try:
        logits = logits_of(model(ids, **forward_inputs(model, ids)))
    finally:
        for handle in handles:
            handle.remove()
    if any(h is None for h in kept):
        raise ProbeInputError(f"{type(model).__name__}'s forward did not run every block it holds ({', '.join(layout.blocks)})")
    return kept, logits


def normed(model: torch.nn.Module, layout: Layout, h: torch.Tensor) -> torch.Tensor:
    """The final norm recomputed on h [... d_model]."""
    if layout.final_norm == "none":
        return h
    if layout.final_norm == "function:rms_norm":
        return F.rms_norm(h, (h.shape[-1],))
    if layout.final_norm == "function:layer_norm":
        return F.layer_norm(h, (h.shape[-1],))
    return model.get_submodule(layout.final_norm)(h)


def decoded(model: torch.nn.Module, layout: Layout, ids: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """The model's logits had its unembedding read final_norm(h) [batch pos d_model]."""
    x = normed(model, layout, h)
    replace = model.get_submodule(layout.unembedding).register_forward_pre_hook(
        lambda module, args: (x.to(args[0].dtype),) + tuple(args[1:]) if args else None)
    try:
        return logits_of(model(ids, **forward_inputs(model, ids)))
    finally:
        replace.remove()


def lens_batch(model: torch.nn.Module, layout: Layout, ids: torch.Tensor, k: int) -> tuple[list[Any], float]:
    """Per point `probes.logit_lens.LayerStats` against the model's own logits on ids [batch pos],
    and max |decoded last block - logits|."""
    from probes.logit_lens import FinalDistribution, layer_stats

    check_layout(model, layout)
    with eval_pass(model):
        points, logits = residuals(model, layout, ids)
        final = FinalDistribution.from_logits(logits)
        stats = []
        for i, h in enumerate(points):
            layer_logits = decoded(model, layout, ids, h)  # [batch pos vocab]
            if i == len(points) - 1:
                error = float((layer_logits.float() - logits.float()).abs().max())
            stats.append(layer_stats(layer_logits, final, ids, k))
    return stats, error


def run_any(model: torch.nn.Module, tokens: Any, *, k: int = 5, include_mid: bool = False, tokenizer: Any = None,
            batch_size: int = 16, progress: bool | None = None, source: str | None = None) -> Any:
    """`probes.logit_lens.run` on a module without hook points of ours: any module through its own
    tail (`lens_batch`), or a snapshot of any model without its code, from the lens it saved."""
    from models.layout import layout_of
    from models.tap_inputs import context_of
    from probes.common import as_batches, model_tokenizer, progress_bar, text_ids
    from probes.logit_lens import READOUT_TOLERANCE, LogitLensResult, log
    from probes.logit_lens import _to_cpu as to_cpu
    from probes.saved_source import SavedModel, saved_lens

    if include_mid:
        raise ProbeInputError(f"{type(model).__name__} has no mid-block hook points: the lens of any module reads "
                              "each block's output only (leave out --mid)")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ProbeInputError(f"k must be a positive int, got {k!r}")
    tokens = text_ids(model, tokens, tokenizer)
    saved = isinstance(model, SavedModel)
    if saved and tokens is None:
        tokens = model.readings()["sample.tokens"]
    n_ctx = int(model.meta["readings"]["positions"]) if saved else context_of(model) or tokens.shape[-1]
    d_vocab = int(model.meta["model"]["d_vocab"]) if saved else None
    if saved:
        batches = as_batches(tokens, n_ctx, d_vocab, batch_size)
        per_batch, readout = saved_lens(model, batches, k), float(model.meta["readings"]["lens"]["readout_error"])
        labels = list(model.meta["readings"]["lens"]["points"])
    else:
        layout = layout_of(model)
        check_layout(model, layout)
        device = next(model.parameters()).device
        per_batch, errors = [], []
        for batch in progress_bar(as_batches(tokens, n_ctx, 2**62, batch_size), progress, "logit lens"):
            stats, err = lens_batch(model, layout, batch.to(device), k)
            per_batch.append((batch.cpu(), [to_cpu(s) for s in stats]))
            errors.append(err)
        readout, labels = max(errors), point_labels(len(layout.blocks))
    result = LogitLensResult(labels, per_batch, readout, model_tokenizer(model, tokenizer), source)
    if result.readout_error > READOUT_TOLERANCE:
        log.warning("the lens at the last block differs from the model's logits by %.3g: this model's readout "
                    "is not final norm + unembedding", result.readout_error)
    return result
