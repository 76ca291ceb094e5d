"""What the snapshot tests share (tests/test_checkpoint_*.py): a seeded small model and its fixture, a
character tokenizer for it, a saved snapshot directory, and an edit of its config.json.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from models import build_model, get_preset
from models.checkpoint import save_snapshot
from models.tokenizers import CharTokenizer

PRESET = "transformer4_rms_small"
TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n"


def small_model(seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return build_model(get_preset(PRESET, **overrides))


def tokenizer_for(model) -> CharTokenizer:
    chars = "".join(chr(32 + i) for i in range(95)) + "\n"
    return CharTokenizer.from_text(chars[: model.cfg.d_vocab])


TOKENS = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]])


@pytest.fixture
def model():
    return small_model()


@pytest.fixture
def snap_dir(tmp_path, model) -> Path:
    return save_snapshot(tmp_path / "snap", model, tokenizer_for(model), step=7, tokens_seen=896)


def _edit_config(directory: Path, **changes) -> None:
    meta = json.loads((directory / "config.json").read_text())
    for key, value in changes.items():
        if value is ...:
            del meta[key]
        else:
            meta[key] = value
    (directory / "config.json").write_text(json.dumps(meta))
