"""A config JSON (--config for a series .pt, or a snapshot's config.json) with a field we do not
know is refused, naming the field and the known ones, at the top level as in the model config
(the top level was read silently: a misspelt field was simply absent)."""

from __future__ import annotations

import json

import pytest
import torch

from models import build_model, get_preset
from models.checkpoint import CheckpointError, load_checkpoint, save_snapshot
from models.store.front import SNAPSHOT_KEYS

CFG = get_preset("transformer4_rms_small", d_vocab=5)


@pytest.fixture
def series_pt(tmp_path):
    torch.save(build_model(CFG).state_dict(), tmp_path / "model.pt")
    return tmp_path / "model.pt"


def test_an_unknown_top_level_field_of_a_config_file_is_refused(series_pt, tmp_path):
    config = tmp_path / "top.json"
    config.write_text(json.dumps({"format_version": 1, "model": CFG.to_dict(), "learning_rate": 0.1}))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(series_pt, config=config)
    assert str(info.value) == (f"{config}: unknown top-level field(s) ['learning_rate']; known: "
                               f"{', '.join(SNAPSHOT_KEYS)}")


def test_an_unknown_model_field_names_the_known_ones(series_pt, tmp_path):
    config = tmp_path / "flat.json"
    config.write_text(json.dumps({**CFG.to_dict(), "learning_rate": 0.1}))
    with pytest.raises(CheckpointError, match=r"unknown transformer config field\(s\) \['learning_rate'\]; "
                                              r"known: family, d_vocab, n_ctx, d_model, n_layers, n_heads, "):
        load_checkpoint(series_pt, config=config)


def test_the_model_of_a_config_json_without_a_version_is_read(series_pt, tmp_path):
    config = tmp_path / "wrapped.json"
    config.write_text(json.dumps({"model": CFG.to_dict()}))
    assert load_checkpoint(series_pt, config=config).config == CFG


def test_a_snapshot_config_json_with_an_unknown_field_is_refused(tmp_path):
    snap = save_snapshot(tmp_path / "snap", build_model(CFG), None)
    meta = json.loads((snap / "config.json").read_text())
    assert set(meta) == set(SNAPSHOT_KEYS)  # what save_snapshot writes is what it reads
    (snap / "config.json").write_text(json.dumps({**meta, "notes": "lr 3e-4"}))
    with pytest.raises(CheckpointError, match=r"config\.json: unknown top-level field\(s\) \['notes'\]; known: "):
        load_checkpoint(snap)
