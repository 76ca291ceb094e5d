"""What every rank under torchrun must see alike before the guard decides (`train.guard`)."""

from __future__ import annotations

import math

import torch

__all__ = ["everyone"]


def everyone(model: torch.nn.Module, loss: float | None, grad_norm: float | None, ratio: float | None = None,
             collapse: int | None = None) -> tuple[float | None, float | None, float | None, int | None]:
    """(the loss, the gradient norm, the update ratio, the collapse's step) alike on every rank under
    torchrun: the loss averaged, the gradient norm nan where any rank's is non-finite, the measured
    ones (the update ratio; the step of the last attention reading before a collapse) from the ranks
    that measured them (rank 0's Monitor), so every rank decides alike. Unchanged on one process."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return loss, grad_norm, ratio, collapse
    bad = grad_norm is not None and not math.isfinite(grad_norm)
    device = next(model.parameters()).device if dist.get_backend() == "nccl" else torch.device("cpu")
    values = [0.0 if loss is None else loss, float(loss is not None), float(bad),
              0.0 if grad_norm is None or bad else grad_norm, float(grad_norm is not None and not bad),
              0.0 if ratio is None else ratio, float(ratio is not None),
              0.0 if collapse is None else float(collapse), float(collapse is not None)]
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    total, given, bads, norms, norm_count, ratios, ratio_count, collapses, collapse_count = t.tolist()
    world = dist.get_world_size()
    norm = math.nan if bads > 0 else (norms / norm_count if norm_count else None)
    return ((total / world if given == world else None), norm, (ratios / ratio_count if ratio_count else None),
            (round(collapses / collapse_count) if collapse_count else None))
