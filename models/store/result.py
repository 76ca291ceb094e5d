"""The one result of every load: :class:`Snapshot` (model, tokenizer, config, metadata, path)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from models.config import ModelConfig
from models.store.foreign import BRIDGE_SOURCE
from models.store.run import snapshot_step
from models.tokenizers import Tokenizer

__all__ = ["Snapshot", "nonfinite_tensors", "text_to_tokens"]


def text_to_tokens(tokenizer: Any, text: str, device: torch.device, owner: str) -> torch.Tensor:
    """Text as a [1 pos] batch of ids on `device`; ValueError naming the problem otherwise."""
    if tokenizer is None:
        raise ValueError(f"{owner} has no tokenizer (a bare .pt state dict or a hand-built model): "
                         "load a checkpoint with one, or pass token ids")
    if not isinstance(text, str) or not text:
        raise ValueError(f"text must be a non-empty string, got {text!r}")
    ids = tokenizer.encode(text)  # names the character it cannot encode
    if not ids:
        raise ValueError(f"{text!r} encodes to zero tokens")
    return torch.tensor([ids], dtype=torch.long, device=device)  # [1 pos]


@dataclass(frozen=True, eq=False)
class Snapshot:
    """A loaded model (eval mode) with its tokenizer (None for a bare .pt), config and metadata."""

    model: torch.nn.Module
    tokenizer: Tokenizer | None
    config: ModelConfig  # or a ForeignConfig (models.store.foreign) for a model we never rebuilt
    meta: dict[str, Any]  # the parsed config.json (synthesised for a .pt)
    path: Path

    def __post_init__(self) -> None:
        # TransformerLens habit: text goes in through model.tokenizer (a plain attribute, not a
        # submodule: the state dict is unchanged); a TransformerBridge keeps its own Hugging Face
        # one, which its to_tokens / generate call
        if self.meta.get("source") != BRIDGE_SOURCE:
            self.model.tokenizer = self.tokenizer

    @property
    def name(self) -> str:
        """``run/step_000500`` for a snapshot of a run, otherwise the directory or file name."""
        if snapshot_step(self.path) is not None and self.path.parent.name:
            return f"{self.path.parent.name}/{self.path.name}"
        return self.path.name

    @property
    def step(self) -> int | None:
        return self.meta.get("step")

    @property
    def tokens_seen(self) -> int | None:
        return self.meta.get("tokens_seen")

    def encode(self, text: str) -> torch.Tensor:
        """Text as a [1 pos] batch of token ids on the model's device, ready for `model(...)`
        or any probe's `run` (longer than the context is fine there: probes window it)."""
        if self.tokenizer is None:
            raise self.no_tokenizer()
        return text_to_tokens(self.tokenizer, text, next(self.model.parameters()).device, self.name)

    def decode(self, ids: torch.Tensor | list[int]) -> str:
        """Token ids ([pos] or [1 pos], a tensor or a list) back to text."""
        if self.tokenizer is None:
            raise self.no_tokenizer()
        flat = ids.reshape(-1).tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return self.tokenizer.decode(flat)

    def no_tokenizer(self) -> ValueError:
        """The one line for text asked of a checkpoint that loaded without a tokenizer: what the
        format's loader said would give it one (``meta["tokenizer_hint"]``)."""
        hint = self.meta.get("tokenizer_hint") or "put the series' vocab.json beside it, or pass token ids"
        return ValueError(f"{self.name} has no tokenizer (token ids only): {hint}")

    def nonfinite_params(self) -> list[str]:
        """Names of parameters/buffers holding NaN or inf (a diverged run loads; probes report it)."""
        return nonfinite_tensors(self.model)


def nonfinite_tensors(model: torch.nn.Module) -> list[str]:
    """State-dict names of the floating tensors holding NaN or inf, in module order."""
    return [name for name, t in model.state_dict().items()
            if t.is_floating_point() and not bool(torch.isfinite(t).all())]
