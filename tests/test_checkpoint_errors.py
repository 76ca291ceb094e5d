"""Loading a damaged or foreign snapshot (models/store/): each failure a CheckpointError that says
what is wrong, in the file's terms.
"""

from __future__ import annotations

import json

import pytest
from checkpoint_kit import _edit_config, model, small_model, snap_dir, tokenizer_for  # noqa: F401 - fixtures

from models.checkpoint import CheckpointError, load_checkpoint, load_snapshot, save_snapshot


# --------------------------------------------------------------------------- errors


def test_missing_directory(tmp_path):
    with pytest.raises(CheckpointError, match=r"nowhere: snapshot directory not found"):
        load_snapshot(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match=r"nowhere: not found"):
        load_checkpoint(tmp_path / "nowhere")


def test_missing_config_json(snap_dir):
    (snap_dir / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"config\.json: missing"):
        load_snapshot(snap_dir)
    with pytest.raises(CheckpointError, match=r"snap/config\.json: missing"):
        load_checkpoint(snap_dir)


def test_config_json_garbage(snap_dir):
    (snap_dir / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"config\.json: not valid JSON"):
        load_snapshot(snap_dir)


def test_config_json_missing_key(snap_dir):
    _edit_config(snap_dir, tensors_sha256=...)
    with pytest.raises(CheckpointError, match=r"config\.json: missing key\(s\) \['tensors_sha256'\]"):
        load_snapshot(snap_dir)


def test_unknown_format_version(snap_dir):
    _edit_config(snap_dir, format_version=99)
    with pytest.raises(CheckpointError, match=r"config\.json: unknown format_version 99"):
        load_snapshot(snap_dir)


def test_invalid_model_config_is_wrapped(snap_dir):
    meta = json.loads((snap_dir / "config.json").read_text())
    _edit_config(snap_dir, model={**meta["model"], "norm": "batch"})
    with pytest.raises(CheckpointError,
                       match=r"config\.json: invalid model config: .*norm must be one of"):
        load_snapshot(snap_dir)


def test_missing_weights_and_tokenizer_files(snap_dir):
    (snap_dir / "vocab.json").unlink()
    with pytest.raises(CheckpointError, match=r"vocab\.json: missing char tokenizer file"):
        load_snapshot(snap_dir)
    (snap_dir / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"model\.safetensors: missing"):
        load_snapshot(snap_dir)


def test_truncated_safetensors(snap_dir):
    weights = snap_dir / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: truncated or corrupt"):
        load_snapshot(snap_dir)
    weights.write_bytes(data[:5])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: truncated or corrupt"):
        load_snapshot(snap_dir)


def test_corrupt_bytes_fail_the_sha256_check(snap_dir):
    weights = snap_dir / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0xFF  # inside the last tensor's data: still parses
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: sha256 mismatch"):
        load_snapshot(snap_dir)


def test_config_that_does_not_match_the_weights(tmp_path):
    model = small_model(d_model=32)
    path = save_snapshot(tmp_path / "s", model, tokenizer_for(model))
    meta = json.loads((path / "config.json").read_text())
    _edit_config(path, model={**meta["model"], "d_model": 16})
    with pytest.raises(CheckpointError) as info:
        load_snapshot(path)
    message = str(info.value)
    assert "\n" not in message
    # the first tensor in the model's state_dict order (its own parameters, then submodules)
    assert message.endswith("s/model.safetensors: tensor 'W_pos' has shape [16, 32] but the "
                            "config expects [16, 16]")


def test_missing_and_unexpected_tensors(tmp_path):
    model = small_model()
    path = save_snapshot(tmp_path / "s", model, tokenizer_for(model))
    meta = json.loads((path / "config.json").read_text())
    _edit_config(path, model={**meta["model"], "final_norm": True})
    with pytest.raises(CheckpointError, match=r"tensor 'ln_final.gamma' \(shape \[32\]\) is missing"):
        load_snapshot(path)
    _edit_config(path, model={**meta["model"], "n_layers": 1})
    with pytest.raises(CheckpointError, match=r"unexpected tensor 'blocks\.1\.attention\.W_O'"):
        load_snapshot(path)


def test_not_a_checkpoint(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("hi")
    for target in (tmp_path / "empty", tmp_path / "notes.txt"):
        with pytest.raises(CheckpointError, match="expected a snapshot directory"):
            load_checkpoint(target)
