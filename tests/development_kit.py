"""Models for the development tests: a 2-layer attention-only transformer with hand-set weights (a
previous-token head in layer 0, an induction head in layer 1, both head 0), and a run of it saved
as snapshots (the trained one is `train.repetition`'s)."""

from __future__ import annotations

from pathlib import Path

import torch

from models.config import TransformerConfig
from train.repetition import attention_only

V, N = 16, 8  # vocabulary, context
# the residual stream: [0, V) the token, [V, V+N) the position, V+N a constant 1, then [.., +V) the
# previous token (written by layer 0)
POS, ONE, PREV = V, V + N, V + N + 1
D = PREV + V


def hand_set(scale: float) -> torch.nn.Module:
    """Layer 0 head 0 attends from i to i-1 (its query the position, its key the next position)
    and writes the token it reads into PREV; layer 1 head 0 attends from a token t to keys whose
    PREV is t (the token after an earlier copy of t), never to key 0 (its constant query meets
    -scale on position 0). `scale` 0: every pattern uniform."""
    cfg = TransformerConfig(d_vocab=V, n_ctx=N, d_model=D, n_layers=2, n_heads=1, d_head=D, d_mlp=1,
                            mlp_bias=False, attn_scale="none")
    model = attention_only(cfg)
    eye = torch.eye(D)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.embedding.weight[:, :V] = torch.eye(V)
        model.W_pos[:, POS:POS + N] = torch.eye(N)
        model.W_pos[:, ONE] = 1.0
        model.W_out[:V] = torch.eye(V)  # logits read the token (unused by the scores)
        a0, a1 = model.blocks[0].attention, model.blocks[1].attention
        q, k, v = (slice(i * D, (i + 1) * D) for i in range(3))
        for p in range(N - 1):  # layer 0: query at position p+1 meets key at position p
            a0.W_QKV[POS + p + 1, q.start + p] = scale
            a0.W_QKV[POS + p, k.start + p] = 1.0
        a0.W_QKV[:V, v] = eye[:V]  # value: the token ...
        a0.W_O[:V, PREV:PREV + V] = torch.eye(V)  # ... written into PREV
        a1.W_QKV[:V, q.start:q.start + V] = scale * torch.eye(V)  # query: the token
        a1.W_QKV[PREV:PREV + V, k.start:k.start + V] = torch.eye(V)  # key: the previous token
        a1.W_QKV[ONE, q.start + V] = 1.0
        a1.W_QKV[POS, k.start + V] = -scale  # key 0 is never matched
    return model


def save_run(run_dir: Path, models: list[tuple[int, torch.nn.Module]]) -> Path:
    from models.checkpoint import save_snapshot, snapshot_name

    for step, model in models:
        save_snapshot(run_dir / snapshot_name(step), model, None, step=step)
    return run_dir
