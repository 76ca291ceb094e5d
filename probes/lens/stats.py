"""The logit lens's pure functions on logits: the final distribution kept as probabilities, and one
layer's statistics against it (KL(final || layer), cross-entropy and rank of the next token, top-k)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class FinalDistribution:
    """The model's output distribution, kept as probabilities: p [batch pos d_vocab] and
    sum p log p [batch pos], which is all KL(final || layer) needs."""

    probs: torch.Tensor
    neg_entropy: torch.Tensor

    @classmethod
    def from_logits(cls, logits: torch.Tensor) -> FinalDistribution:
        log_probs = logits.float().log_softmax(-1)  # [batch pos d_vocab]
        probs = log_probs.exp()
        neg_entropy = dot(probs, log_probs)  # [batch pos]
        return cls(probs, neg_entropy)


def dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Sum over the last axis of a * b without a [..., d_vocab] temporary: [... v] -> [...]."""
    return (a.unsqueeze(-2) @ b.unsqueeze(-1)).squeeze(-1).squeeze(-1)


@dataclass
class LayerStats:
    kl: torch.Tensor  # [batch pos] KL(final || layer), nats
    cross_entropy: torch.Tensor  # [batch pos-1] -log p_layer(next token)
    rank: torch.Tensor  # [batch pos-1] tokens with a strictly higher logit than the next token
    top_probs: torch.Tensor  # [batch pos k]
    top_ids: torch.Tensor  # [batch pos k]
    finite: torch.Tensor  # [batch pos] bool: the layer's logits are all finite there


def layer_stats(logits: torch.Tensor, final: FinalDistribution, tokens: torch.Tensor, k: int) -> LayerStats:
    """One layer's lens statistics from its logits [batch pos d_vocab] and tokens [batch pos]."""
    logits = logits.float()
    lse = logits.logsumexp(-1)  # [batch pos]
    kl = final.neg_entropy - (dot(final.probs, logits) - lse)  # sum p_f log p_f - sum p_f log p_l
    targets = tokens[:, 1:].unsqueeze(-1)  # [batch pos-1 1]
    target_logit = logits[:, :-1].gather(-1, targets)  # [batch pos-1 1]
    cross_entropy = lse[:, :-1] - target_logit.squeeze(-1)
    rank = (logits[:, :-1] > target_logit).sum(-1).float()
    finite = torch.isfinite(logits).all(-1)  # [batch pos]
    rank[~finite[:, :-1]] = float("nan")  # NaN logits rank nothing first
    top_logits, top_ids = logits.topk(min(k, logits.shape[-1]), dim=-1)  # [batch pos k]
    return LayerStats(kl.clamp_min(0.0), cross_entropy, rank, (top_logits - lse.unsqueeze(-1)).exp(),
                      top_ids, finite)
