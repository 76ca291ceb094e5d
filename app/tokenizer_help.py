"""What the app says when text is asked of a checkpoint loaded without a tokenizer: which files to
put where, then reload. The loaders' own hint (`Snapshot.no_tokenizer`) names the CLI's
`--tokenizer`, a flag the app has no place for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from models.store.foreign import BRIDGE_SOURCE  # torch-free


def tokenizer_files(source: str | None, d_vocab: int) -> str:
    """The tokenizer files a checkpoint of this format and vocabulary reads from beside itself."""
    from models.store.nanogpt import GPT2_VOCABS  # here: the app starts without torch

    if source == "huggingface" or (source == "nanogpt" and d_vocab in GPT2_VOCABS):
        return "GPT-2's tokenizer.json (or vocab.json and merges.txt)"
    if source == "nanogpt":
        return "nanoGPT's meta.pkl (its data/<dataset>/prepare.py writes it)"
    return "the series' vocab.json"


def no_tokenizer(snap: Any) -> ValueError:
    """One line: the checkpoint has token ids only; put its tokenizer beside it and reload the page."""
    meta = getattr(snap, "meta", None) or {}
    if meta.get("source") in ("nanochat", BRIDGE_SOURCE) and meta.get("tokenizer_hint"):
        # their loader's own line says where the tokenizer lives (nanochat's is not beside the model)
        return ValueError(f"{snap.name} has no tokenizer (token ids only): {meta['tokenizer_hint']}; then "
                          "reload the page")
    path = Path(snap.path)
    folder = path.parent if path.is_file() else path
    files = tokenizer_files(meta.get("source"), snap.config.d_vocab)
    return ValueError(f"{snap.name} has no tokenizer (token ids only): put {files} in {folder}, then "
                      "reload the page")
