"""AtP*'s QK fix (Kramár et al. 2024, "AtP*: An efficient and scalable method for localizing LLM
behaviour to components", section 3.1.1) for the activations patched here.

Attribution patching linearises the attention softmax: where a pattern saturates, a patch that moves
a query or a key changes the pattern a lot while the gradient says almost nothing. AtP* recomputes
the softmax exactly for the patched queries and keys and takes the pattern's change times the
gradient of the metric with respect to the pattern. Here a patched activation reaches later queries
and keys through the residual stream: for each attention layer that reads it directly (its own
block's for resid_pre, every later block's), the queries and keys it moves are recomputed from the
residual plus the patch's change (through the layer's norm, exactly), and

    AtP*(cell) = AtP(cell) + sum over those layers of
                 [ (A_exact - A) . dm/dA  -  (dm/dq . J_q delta + dm/dk . J_k delta) ]

the second term removing what AtP counted for the same queries and keys to first order (J delta: the
change of q and k linearised; dm/dq . J_q delta = (J_q^T dm/dq) . delta: one backward pass per layer
gives it for every cell). It reads our Transformer's blocks, so
it needs one (pre-norm or no norm, with residual connections).
"""

from __future__ import annotations

from typing import Any

import torch

from probes.common import ProbeInputError
from probes.patching.cells import Sweep
from probes.patching.replay import project

BUDGET = 64 * 2**20  # bytes of recomputed patterns held at once


def qk_names(n_layers: int) -> list[str]:
    return [name.format(l) for l in range(n_layers) for name in
            ("blocks.{}.hook_resid_pre", "blocks.{}.attn.hook_q", "blocks.{}.attn.hook_k",
             "blocks.{}.attn.hook_pattern")]


def check_qk_fix(model: Any) -> None:
    from probes.patching.engines import is_ours
    cfg = getattr(model, "cfg", None)
    why = (f"{type(model).__name__} is not one" if not is_ours(model) else "this one has no residual connections"
           if not cfg.residual else "this one normalises after each sublayer"
           if cfg.norm != "none" and cfg.norm_placement != "pre" else None)
    if why:
        raise ProbeInputError(f"AtP*'s QK fix recomputes attention in our Transformer's blocks (pre-norm, with "
                              f"residual connections), and {why}: use plain attribution")


def residual_deltas(model: Any, sweep: Sweep, layer: int, base: torch.Tensor, donor: torch.Tensor,
                    cells: list) -> torch.Tensor:
    """What each cell's patch adds to the residual stream: [cells batch pos d_model] at all positions,
    [cells batch d_model] at the cell's one position when the sweep is by position."""
    diff = donor - base  # [batch pos d_model] or [batch pos head d_head]
    if sweep.what == "heads":  # each head's share of the output projection
        W_O = model.blocks[layer].attention.per_head_W_O()  # [head d_head d_model]
        diff = torch.einsum("bphe,hed->hbpd", diff, W_O)  # [head batch pos d_model]
    return torch.stack([(diff[head] if sweep.what == "heads" else diff)[:, slice(None) if pos is None else pos]
                        for pos, head in cells])


def pattern_of(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal softmax of q, k [... pos head d_head] -> [... head q_pos k_pos]."""
    n = q.shape[-3]
    scores = torch.einsum("...qhe,...khe->...hqk", q / scale, k)
    hidden = torch.ones(n, n, dtype=torch.bool, device=q.device).triu_(1)
    return scores.masked_fill(hidden, float("-inf")).softmax(-1)


def qk_pullback(model: Any, later: int, base: dict) -> torch.Tensor:
    """What AtP counts for a residual change through layer `later`'s queries and keys, as one vector:
    d(q . dm/dq + k . dm/dk)/d resid_pre [batch pos d_model] (a change delta counts pullback . delta).
    One backward pass per layer, whatever the number of cells."""
    block = model.blocks[later]
    x, _ = base[f"blocks.{later}.hook_resid_pre"]  # [batch pos d_model]
    g_q, g_k = base[f"blocks.{later}.attn.hook_q"][1], base[f"blocks.{later}.attn.hook_k"][1]
    with torch.enable_grad():
        x = x.detach().requires_grad_(True)
        q, k, _ = project(block.attention, block.norm(1, x, "pre", True))  # [batch pos head d_head]
        (pulled,) = torch.autograd.grad((q * g_q).sum() + (k * g_k).sum(), x)
    return pulled


def layer_correction(model: Any, later: int, deltas: torch.Tensor, base: dict, pullback: torch.Tensor,
                     positions: torch.Tensor | None) -> torch.Tensor:
    """The QK fix at attention layer `later` for each cell's residual change: [cells]. deltas
    [cells batch pos d] at every position, or [cells batch d] at `positions` [cells] alone (then
    only that query's row and that key's column of each pattern change)."""
    block = model.blocks[later]
    attn = block.attention
    x, _ = base[f"blocks.{later}.hook_resid_pre"]  # [batch pos d_model]
    q, k = base[f"blocks.{later}.attn.hook_q"][0], base[f"blocks.{later}.attn.hook_k"][0]  # [batch pos head d_head]
    A, g_A = base[f"blocks.{later}.attn.hook_pattern"]  # [batch head q k]

    def qk(resid):  # [... d_model] -> q, k [... head d_head]
        q_, k_, _ = project(attn, block.norm(1, resid, "pre", True))
        return q_, k_
    if positions is None:
        A_new = pattern_of(*qk(x + deltas), attn.scale)  # [cells batch head q k]
        linear = (deltas * pullback).sum(dim=(1, 2, 3))
        return ((A_new - A) * g_A).sum(dim=(1, 2, 3, 4)) - linear
    cells = torch.arange(len(positions))
    q_at, k_at = qk(x[:, positions].transpose(0, 1) + deltas)  # [cells batch head d_head]
    scores = torch.einsum("bqhe,bkhe->bhqk", q / attn.scale, k).expand(len(positions), -1, -1, -1, -1).clone()
    scores[cells, :, :, :, positions] = torch.einsum("bqhe,cbhe->cbhq", q / attn.scale, k_at)  # the key's column
    scores[cells, :, :, positions, :] = torch.einsum("cbhe,bkhe->cbhk", q_at / attn.scale, k)  # the query's row
    scores[cells, :, :, positions, positions] = (q_at * k_at).sum(-1) / attn.scale
    n = q.shape[1]
    A_new = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu_(1), float("-inf")).softmax(-1)
    linear = (deltas * pullback[:, positions].transpose(0, 1)).sum(dim=(1, 2))  # [cells]
    return ((A_new - A) * g_A).sum(dim=(1, 2, 3, 4)) - linear


def qk_correction(model: Any, sweep: Sweep, base: dict, donor_acts: dict) -> torch.Tensor:
    """What AtP* adds to every cell's AtP estimate: [sweep.shape]."""
    cells = sweep.cells()
    x = base["blocks.0.hook_resid_pre"][0]
    batch, n = x.shape[:2]
    d = x.shape[-1]
    # per cell: a few patterns [batch head pos pos] and its residual changes and q/k [batch pos|1 d]
    per_cell = 4 * batch * (3 * sweep.n_heads * n * n + 4 * (1 if sweep.by_position else n) * d)
    size = max(1, BUDGET // per_cell)
    out = torch.zeros(sweep.n_layers, len(cells))
    pullbacks = [qk_pullback(model, later, base) for later in range(sweep.n_layers)]
    for layer in range(sweep.n_layers):
        act = base[layer][0]
        first = layer if sweep.what == "resid" else layer + 1  # the first attention reading it directly
        for i in range(0, len(cells), size):
            chunk = cells[i:i + size]
            deltas = residual_deltas(model, sweep, layer, act, donor_acts[layer], chunk)
            positions = torch.tensor([p for p, _ in chunk], device=x.device) if sweep.by_position else None
            for later in range(first, sweep.n_layers):
                fix = layer_correction(model, later, deltas, base, pullbacks[later], positions)
                out[layer, i:i + len(chunk)] += fix.float().cpu()
    return out.view(sweep.shape)
