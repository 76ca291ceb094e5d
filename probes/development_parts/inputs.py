"""What every snapshot of a run is read on (`probes.development`): the text windows and the random
repeat, chosen once from the run's latest snapshot, and their hash (the development caches' key)."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from probes.errors import ProbeInputError

log = logging.getLogger("probes.development")  # its lines are the development's

__all__ = ["Inputs", "REPEAT_SAMPLES", "run_inputs"]

REPEAT_SAMPLES = 8  # rows of the random repeat every snapshot reads


@dataclass
class Inputs:
    """The text windows [batch pos] and the random repeat every snapshot of a run reads, and their hash.
    `saved`: the run's snapshots are of a model without its code, which read their own saved sample."""

    tokens: torch.Tensor | None
    repeat: tuple[torch.Tensor, int] | None
    source: str
    saved: bool = False

    @property
    def key(self) -> str:
        from probes.development_parts.cache import READING_VERSION

        # the tokens themselves, not the words naming them (a path seen from another directory)
        digest = hashlib.sha256(f"v{READING_VERSION}".encode() + (self.source.encode() if self.saved else b""))
        for t in (self.tokens, None if self.repeat is None else self.repeat[0]):
            if t is not None:
                digest.update(t.cpu().to(torch.int64).numpy().tobytes())
        return digest.hexdigest()

    def for_snapshot(self, snap: Any) -> tuple[torch.Tensor, tuple[torch.Tensor, int]]:
        from probes.common import sample_only, saved_sample

        if sample_only(snap):
            return saved_sample(snap)[0], self.repeat or (torch.zeros(1, 2, dtype=torch.long), 1)
        if self.tokens is None or self.repeat is None:
            raise ProbeInputError(f"{snap.name}: no text to read it on (give tokens or --data)")
        return self.tokens, self.repeat


def run_inputs(latest: Path, tokens: Any = None, data: Path | None = None, samples: int = 8,
               seed: int = 0) -> Inputs:
    """The inputs of a run, from its latest snapshot: given tokens, windows of `data`, else of the run's
    recorded data (its validation split, `probes.common.default_windows`); a model without its code: its
    saved sample. No text anywhere: the repeat stands for the text too (said in the source)."""
    from models.checkpoint import load_checkpoint
    from probes.common import as_batches, default_windows, encode_text, read_text_file, sample_only, sample_windows
    from probes.common import random_repeat_tokens

    snap = load_checkpoint(latest)
    if sample_only(snap):
        if tokens is not None or data is not None:  # not silently: the user asked for other text
            log.warning("%s: its snapshots hold a model saved without its code, read from what each saved "
                        "(its sample and repeat): the %s given is not read", latest.parent,
                        "tokens" if tokens is not None else f"--data {data}")
        return Inputs(None, None, "each snapshot's saved sample and repeat", saved=True)
    n_ctx, d_vocab = int(snap.config.n_ctx), int(snap.config.d_vocab)
    length = n_ctx // 2
    repeat = (random_repeat_tokens(d_vocab, length, REPEAT_SAMPLES, seed=0), length)
    if tokens is not None:
        batches = as_batches(tokens, n_ctx, d_vocab, 1 << 16)
        width = max(b.shape[1] for b in batches)  # a row's short last window is left out: one [batch pos]
        kept = torch.cat([b for b in batches if b.shape[1] == width])
        return Inputs(kept, repeat, f"the given tokens ({kept.shape[0]} window(s) of {width})")
    if data is not None:
        ids = encode_text(snap.tokenizer, read_text_file(data))
        return Inputs(sample_windows(ids, n_ctx, samples, seed), repeat, f"{samples} windows of {data}, seed {seed}")
    try:
        windows, source = default_windows(snap, snap.tokenizer, n_ctx, samples, seed)
        return Inputs(windows, repeat, source)
    except ProbeInputError as err:
        log.info("%s: %s; reading the random repeat as the text", latest, err)
        return Inputs(repeat[0], repeat, "no text (the random repeat read as the text)")
