"""The language-modelling loss both families train on, shared by `train` and `probes.updates`.

A block of token ids [batch length] gives inputs block[:, :-1]; the model returns P predictions
per row ([batch P vocab]: P = length - 1 for a transformer, the windows of an MLP LM), and the
targets are the last P ids, block[:, -P:].
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def block_len(cfg: Any) -> int:
    """Tokens per training window: n_ctx + 1 (transformer; a TransformerLens cfg counts as one)
    or 2 * n_ctx (MLP family: its n_ctx-token window slides over n_ctx predictions)."""
    return cfg.n_ctx + 1 if getattr(cfg, "family", "transformer") == "transformer" else 2 * cfg.n_ctx


def lm_loss(model: torch.nn.Module, block: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (nats) over every predicted position of a [batch length] block."""
    logits, targets = _logits_and_targets(model, block)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def lm_loss_and_z(model: torch.nn.Module, block: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean cross-entropy, mean log²Z) over the predicted positions, log Z = logsumexp of a
    position's logits: the z-loss (PaLM; Wortsman et al. 2023) adds COEF * log²Z to the loss, so
    that log Z stays near 0 and the output logits cannot drift off together."""
    logits, targets = _logits_and_targets(model, block)  # [batch P vocab], [batch P]
    log_z = logits.logsumexp(dim=-1)  # [batch P]
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten()), log_z.square().mean()


def _logits_and_targets(model: torch.nn.Module, block: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits = model(block[:, :-1])  # [batch P vocab]
    targets = block[:, -logits.shape[1]:]  # [batch P]
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()  # the softmax of autocast logits in fp32; a float64 model stays float64
    return logits, targets


def lm_loss_terms(model: torch.nn.Module, block: torch.Tensor) -> int:
    """How many predictions `lm_loss` averages over for a [batch length] block."""
    cfg = model.cfg  # a TransformerLens cfg has no family: a transformer, as in block_len
    transformer = getattr(cfg, "family", "transformer") == "transformer"
    predictions = block.shape[1] - 1 if transformer else block.shape[1] - cfg.n_ctx
    return block.shape[0] * predictions
