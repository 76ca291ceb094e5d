"""The phase kind of benchmarks/bench_guard.py: a healthy run whose attention changes fast on purpose.

The 2-layer attention-only model of `train.repetition` (its MLPs zeroed and frozen) on rows of a
random segment repeated to fill the context, under Adam at a constant rate, the loss on the
repeated targets only: induction heads form in layer 1 within the run, a head's attention going
from spread to one-hot in a few dozen steps while the loss drops (Olsson et al. 2022) — what the
guard's attention rule must tell from the series' rate failure. At half, one and two times its
good rate (5e-3), each run must end bitwise as the unwatched run.
"""

from __future__ import annotations

from typing import Any

GOOD_PHASE = 5e-3
PHASE_RATES = (0.5, 1.0, 2.0)  # times GOOD_PHASE: the phase change comes at several rates
HELD_ROWS, EVAL_ROWS = 64, 8  # held-out rows of the val loss; the first EVAL_ROWS are the Monitor's eval tokens


def build_phase(seed: int) -> Any:
    import torch

    from train.repetition import attention_only, repetition_config
    torch.manual_seed(seed)
    return attention_only(repetition_config()).train()


def phase_optimizer(model: Any, lr: float) -> tuple[Any, Any]:
    """Adam at a constant rate over the trainable (attention) weights, as `train.repetition` trains."""
    import torch
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)


def phase_batch(seed: int, step: int) -> tuple[Any, Any]:
    """(tokens [batch n_ctx+1], repeated [batch n_ctx]) of `step`, the same in every arm."""
    import torch

    from train.repetition import ALPHABET, BATCH, N_CTX, repetition_batch
    return repetition_batch(BATCH, N_CTX, len(ALPHABET), torch.Generator().manual_seed(seed * 1_000_003 + step))


def held_out() -> tuple[Any, Any]:
    import torch

    from train.repetition import ALPHABET, N_CTX, repetition_batch
    return repetition_batch(HELD_ROWS, N_CTX, len(ALPHABET), torch.Generator().manual_seed(7))


def phase_loss(model: Any, tokens: Any, repeated: Any) -> Any:
    from train.repetition import repeated_loss
    return repeated_loss(model, tokens, repeated)


def phase_val(model: Any) -> float:
    import torch
    was = model.training
    model.eval()
    with torch.no_grad():
        loss = float(phase_loss(model, *held_out()))
    model.train(was)
    return loss


def phase_eval_tokens() -> Any:
    """[EVAL_ROWS n_ctx] held-out rows: the Monitor's eval tokens (never trained on)."""
    from train.repetition import N_CTX
    return held_out()[0][:EVAL_ROWS, :N_CTX]
