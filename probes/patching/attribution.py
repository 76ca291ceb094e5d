"""Attribution patching (AtP): every patch's effect on the metric estimated at once, from one forward
and one backward pass on the run that receives the patches and one forward on the donor:

    patched(cell) ~ metric(base) + sum over the cell's slice of (a_donor - a_base) * d metric / d a

(the batch's rows summed too: a patch replaces the activation in every row). It is exact for a
metric linear in the activation and misleads where the path from the activation to the metric
bends: above all where an attention softmax saturates, so that a small move of a query or key
changes the pattern by nothing to first order and by a lot when made whole. `atp_star` adds the
QK fix of AtP* (Kramár et al. 2024, `probes.patching.qk_fix`).

The gradients are read at zero tensors added at each hook point (a leaf per hook, so that no path
from an earlier activation is cut and a model whose weights need no gradient still gives them).
"""

from __future__ import annotations

from typing import Any

import torch

from probes.patching.cells import Sweep
from probes.patching.engines import editing_engine


def reduce_to_cells(prod: torch.Tensor, sweep: Sweep) -> torch.Tensor:
    """(a_donor - a_base) * grad of one layer, [batch pos head d_head] or [batch pos d_model], summed
    over what one cell patches: -> [pos head], [head], [pos] or []."""
    dims = [0, prod.dim() - 1] + ([] if sweep.by_position else [1])
    return prod.float().sum(dim=dims)


def with_gradients(engine: Any, tokens: torch.Tensor, metric: Any, extra: list[str]) -> tuple[float, dict]:
    """One forward and one backward on tokens: the metric, and {layer (the sweep's activation) or
    hook name (`extra`, ours only): (activation detached, d metric / d activation)}."""
    leaves: dict[Any, tuple[torch.Tensor, torch.Tensor]] = {}

    def perturb(key: Any):
        def edit(x: torch.Tensor) -> torch.Tensor:
            leaf = torch.zeros_like(x, requires_grad=True)
            leaves[key] = (x.detach(), leaf)
            return x + leaf
        return edit
    edits = {l: perturb(l) for l in range(engine.n_layers)}
    with torch.enable_grad():
        if extra:  # AtP*: our hook points beside the sweep's
            hooks = [(engine.names[l], lambda x, hook, e=e: e(x)) for l, e in edits.items()]
            hooks += [(n, lambda x, hook, e=perturb(n): e(x)) for n in extra]
            logits = engine.model.run_with_hooks(tokens, fwd_hooks=hooks)
        else:
            logits = engine.run(tokens, edits)
        value = metric(logits)
        keys = list(leaves)
        grads = torch.autograd.grad(value, [leaves[k][1] for k in keys], allow_unused=True)
    return float(value.detach()), {k: (leaves[k][0], torch.zeros_like(leaves[k][0]) if g is None else g)
                                   for k, g in zip(keys, grads)}


def attribute(model: Any, sweep: Sweep, metric: Any, clean_ids: torch.Tensor, corrupt_ids: torch.Tensor,
              direction: str, atp_star: bool) -> tuple[torch.Tensor, float, float, int]:
    """(patched estimates [sweep.shape], clean metric, corrupt metric, forward passes)."""
    base_ids, donor_ids = (corrupt_ids, clean_ids) if direction == "denoise" else (clean_ids, corrupt_ids)
    engine = editing_engine(model, sweep.what, sweep.n_layers, base_ids)
    extra = []
    if atp_star:
        from probes.patching.qk_fix import check_qk_fix, qk_names
        check_qk_fix(model)
        extra = [n for n in qk_names(sweep.n_layers) if n not in engine.names]
    base_value, base = with_gradients(engine, base_ids, metric, extra)
    if atp_star:  # the QK fix reads activations by hook name, the sweep's own too
        base.update({engine.names[l]: base[l] for l in range(sweep.n_layers)})
    with torch.no_grad():
        donor = engine.trace(donor_ids)
        donor_value = float(metric(donor.logits))
        values = torch.stack([reduce_to_cells((donor.acts[l] - base[l][0]) * base[l][1], sweep)
                              for l in range(sweep.n_layers)]) + base_value  # [sweep.shape]
        if atp_star:
            from probes.patching.qk_fix import qk_correction
            values += qk_correction(model, sweep, base, donor.acts)
    clean_value, corrupt_value = (donor_value, base_value) if direction == "denoise" else (base_value, donor_value)
    return values.cpu(), clean_value, corrupt_value, 2
