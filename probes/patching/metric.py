"""What a patched run is scored by: a callable on one run's logits, as TransformerLens's
`patching_metric`, or the two built in (the answer's log-probability, or the logit difference
answer - wrong, both at the last position).

The engines call `score(metric, logits, n)` on the logits of n patched runs stacked along the
batch ([n*batch pos vocab], patch-major): a built-in metric scores them all at once; a user's
callable sees each patched run's [batch pos vocab] alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from probes.errors import ProbeInputError


@dataclass(frozen=True)
class LastPosition:
    """logit[answer] - logit[wrong] (with `wrong`) or log p(answer) at the last position,
    averaged over the batch. It reads the last position only, so the engines unembed only it."""
    answer: int
    wrong: int | None = None
    last_only = True

    @property
    def name(self) -> str:
        return "logit_diff" if self.wrong is not None else "logprob"

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:  # [batch pos vocab] -> []
        return self.each(logits[:, -1]).mean()

    def each(self, last: torch.Tensor) -> torch.Tensor:  # [rows vocab] -> [rows]
        last = last.float()
        if self.wrong is not None:
            return last[:, self.answer] - last[:, self.wrong]
        return last.log_softmax(-1)[:, self.answer]


class Callable_:
    """A user's metric: called once per patched run on its [batch pos vocab] logits."""
    last_only = False

    def __init__(self, fn: Callable[[torch.Tensor], Any]):
        self.fn = fn
        self.name = getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        out = torch.as_tensor(self.fn(logits))
        if out.numel() != 1:
            raise ProbeInputError(f"the metric {self.name} must return a scalar, got shape {tuple(out.shape)}")
        return out.reshape(())


def make_metric(metric: Any, answer: Any, wrong: Any, d_vocab: int, resolve: Callable[[Any], int]) -> Any:
    """The metric `run` was given: a callable, or answer (and wrong) as ids or one-token texts."""
    if metric is not None:
        if answer is not None or wrong is not None:
            raise ProbeInputError("give either metric= or answer= (and wrong=), not both")
        if not callable(metric):
            raise ProbeInputError(f"metric must be a callable on logits [batch pos vocab], got {type(metric).__name__}")
        return Callable_(metric)
    if answer is None:
        raise ProbeInputError("give an answer token (and a wrong one for the logit difference), or a metric")
    answer_id = resolve(answer)
    wrong_id = None if wrong is None else resolve(wrong)
    if wrong_id == answer_id:
        raise ProbeInputError(f"the answer and the wrong token are the same token (id {answer_id})")
    return LastPosition(answer_id, wrong_id)


def score(metric: Any, logits: torch.Tensor, n: int) -> torch.Tensor:
    """The metric of each of n patched runs: logits [n*batch pos vocab] (patch-major) -> [n]."""
    if isinstance(metric, LastPosition):
        return metric.each(logits[:, -1]).view(n, -1).mean(1)
    runs = logits.view(n, -1, *logits.shape[1:])  # [n batch pos vocab]
    return torch.stack([metric(run).detach().float() for run in runs])
