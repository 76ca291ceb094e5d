"""The language-modelling loss both families train on, shared by `train` and `probes.updates`.

A block of token ids [batch length] gives inputs block[:, :-1]; the model returns P predictions
per row ([batch P vocab]: P = length - 1 for a transformer, the windows of an MLP LM), and the
targets are the last P ids, block[:, -P:].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def lm_loss(model: torch.nn.Module, block: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (nats) over every predicted position of a [batch length] block."""
    logits = model(block[:, :-1])  # [batch P vocab]
    targets = block[:, -logits.shape[1]:]  # [batch P]
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
