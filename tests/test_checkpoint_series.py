"""The series' `.pt` files (models/store/): loaded with a preset or config with identical logits,
their names mapped, pickle payloads and non-tensor entries refused.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
from checkpoint_kit import PRESET, TOKENS, model, small_model  # noqa: F401 - fixtures

from models import build_model, get_preset
from models.checkpoint import CheckpointError, load_checkpoint, load_series_state_dict
from models.tokenizers import CharTokenizer


# --------------------------------------------------------------------------- series .pt


def test_series_pt_loads_with_preset_and_identical_logits(tmp_path, model):
    model.eval()
    torch.save(model.state_dict(), tmp_path / "model.pt")
    snap = load_checkpoint(tmp_path / "model.pt", preset=PRESET)
    assert torch.equal(snap.model(TOKENS), model(TOKENS))
    assert snap.tokenizer is None and snap.name == "model.pt"
    # wrapped in {"model": ...}, with a vocab.json beside it that sets d_vocab
    small = small_model(d_vocab=60)
    small.eval()
    (tmp_path / "wrapped").mkdir()
    torch.save({"model": small.state_dict(), "iter": 3}, tmp_path / "wrapped" / "ckpt.pt")
    CharTokenizer.from_text("".join(chr(40 + i) for i in range(60))).save(tmp_path / "wrapped")
    snap = load_checkpoint(tmp_path / "wrapped" / "ckpt.pt", preset=PRESET)
    assert snap.config.d_vocab == 60 and snap.tokenizer.vocab_size == 60
    assert torch.equal(snap.model(TOKENS), small(TOKENS))


def test_series_attnnet_names_load_through_the_models_prehook(tmp_path):
    cfg = get_preset("attn1_sqrtd_small")
    model = build_model(cfg).eval()
    series = {}
    for key, value in model.state_dict().items():
        key = key.replace("blocks.0.attention.heads.0.", "attention.").replace("blocks.0.mlp.", "mlp.")
        series[key] = value
    assert "attention.W_Q" in series
    torch.save(series, tmp_path / "attn.pt")
    snap = load_series_state_dict(tmp_path / "attn.pt", cfg)
    tokens = torch.tensor([[1, 2, 3, 4]])
    assert torch.equal(snap.model(tokens), model(tokens))


def test_series_pt_with_config_file(tmp_path, model):
    model.eval()
    torch.save({"state_dict": model.state_dict()}, tmp_path / "m.pt")
    (tmp_path / "cfg.json").write_text(json.dumps(model.cfg.to_dict()))
    snap = load_checkpoint(tmp_path / "m.pt", config=tmp_path / "cfg.json")
    assert torch.equal(snap.model(TOKENS), model(TOKENS))


def test_series_pt_errors(tmp_path, model):
    torch.save(model.state_dict(), tmp_path / "m.pt")
    with pytest.raises(CheckpointError, match=r"m\.pt: a series \.pt needs --preset or --config"):
        load_checkpoint(tmp_path / "m.pt")
    with pytest.raises(CheckpointError, match=r"m\.pt: unknown preset 'no_such_preset'"):
        load_checkpoint(tmp_path / "m.pt", preset="no_such_preset")
    with pytest.raises(CheckpointError, match=r"m\.pt: tensor 'W_pos' has shape \[16, 32\]"
                                              r" but the config expects \[32, 256\]"):
        load_checkpoint(tmp_path / "m.pt", preset="transformer4_rms")


class _Payload:
    """Unpickling this would create a marker file: it must never happen."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_pickle_payload_is_refused_and_never_runs(tmp_path):
    armed = tmp_path / "armed"
    pickle.loads(pickle.dumps(_Payload(str(armed))))  # the payload is live under plain pickle
    assert armed.exists()
    marker = tmp_path / "pwned"
    torch.save({"model": {"x": torch.zeros(1)}, "evil": _Payload(str(marker))}, tmp_path / "evil.pt")
    assert not marker.exists()
    with pytest.raises(CheckpointError,
                       match=r"evil\.pt: cannot load with torch\.load\(weights_only=True\)"):
        load_checkpoint(tmp_path / "evil.pt", preset=PRESET)
    assert not marker.exists()


def test_non_tensor_entries_are_refused(tmp_path):
    torch.save({"embedding.weight": [1, 2, 3]}, tmp_path / "lists.pt")
    with pytest.raises(CheckpointError, match=r"lists\.pt: entry 'embedding\.weight' is a list"):
        load_checkpoint(tmp_path / "lists.pt", preset=PRESET)
