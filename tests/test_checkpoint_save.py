"""Saving snapshots (models/store/): weights, config, logits, tokenizer and optimizer state round
trip; shared tensors saved once; a save is atomic (a crash keeps the previous snapshot loadable).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from checkpoint_kit import TOKENS, model, small_model, snap_dir, tokenizer_for  # noqa: F401 - fixtures

from models import build_model, get_preset
from models.checkpoint import (CheckpointError, Snapshot, list_snapshots, load_checkpoint,
                               load_optimizer_state, load_snapshot, save_snapshot, snapshot_name)


# --------------------------------------------------------------------------- round trip


def test_round_trip_weights_config_logits_tokenizer(tmp_path, model):
    tok = tokenizer_for(model)
    train_config = {"optimizer": "adamw", "lr": 3e-4, "betas": [0.9, 0.95]}
    path = save_snapshot(tmp_path / "s", model, tok, step=500, tokens_seen=64000,
                         train_config=train_config)
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors", "vocab.json"]
    snap = load_snapshot(path)
    assert isinstance(snap, Snapshot)
    assert snap.config == model.cfg
    assert snap.model.cfg == model.cfg
    assert not snap.model.training
    original, loaded = model.state_dict(), snap.model.state_dict()
    assert original.keys() == loaded.keys()
    for name in original:
        assert torch.equal(original[name], loaded[name]), name
    model.eval()
    assert torch.equal(model(TOKENS), snap.model(TOKENS))
    assert snap.tokenizer.chars == tok.chars
    assert snap.tokenizer.decode(snap.tokenizer.encode("Hear me, speak!")) == "Hear me, speak!"
    assert (snap.step, snap.tokens_seen) == (500, 64000)
    assert snap.meta["train_config"] == train_config
    assert snap.meta["format_version"] == 1
    assert snap.meta["model"] == model.cfg.to_dict()
    assert snap.meta["tokenizer"] == {"kind": "char", "files": ["vocab.json"]}
    assert len(snap.meta["tensors_sha256"]) == 64
    assert snap.name == "s"
    assert snap.nonfinite_params() == []


def test_optimizer_state_round_trip(tmp_path, model):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    loss = torch.nn.functional.cross_entropy(model(TOKENS[:, :-1])[0], TOKENS[0, 1:])
    loss.backward()
    opt.step()
    path = save_snapshot(tmp_path / "s", model, tokenizer_for(model), step=1, optimizer=opt)
    state = load_optimizer_state(path)
    expected = opt.state_dict()
    assert state["param_groups"][0]["lr"] == 1e-3
    assert tuple(state["param_groups"][0]["betas"]) == (0.9, 0.95)
    assert state["state"].keys() == expected["state"].keys()
    for i, entry in expected["state"].items():
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(state["state"][i][key], entry[key])
    fresh = torch.optim.AdamW(load_snapshot(path).model.parameters(), lr=1e-3)
    fresh.load_state_dict(state)  # resumable
    assert load_optimizer_state(save_snapshot(tmp_path / "t", model, None)) is None


def test_tied_and_view_sharing_tensors_are_saved_once(tmp_path):
    cfg = get_preset("gpt2_124m_small")
    assert cfg.unembed == "tied"
    model = build_model(cfg)
    with torch.no_grad():  # make two parameters share one storage, as weight tying does
        model.blocks[1].attention.W_O = model.blocks[0].attention.W_O
    path = save_snapshot(tmp_path / "tied", model, None)
    snap = load_snapshot(path)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, snap.model.state_dict()[name]), name
    assert snap.tokenizer is None


def test_snapshot_device_and_nonfinite_params(tmp_path, model):
    with torch.no_grad():
        model.blocks[0].attention.heads[2].W_K[0, 0] = float("nan")
        model.W_out[1, 1] = float("inf")
    snap = load_snapshot(save_snapshot(tmp_path / "nan", model, tokenizer_for(model)), device="cpu")
    assert snap.nonfinite_params() == ["W_out", "blocks.0.attention.heads.2.W_K"]
    assert not torch.isfinite(snap.model(TOKENS)).all()


# --------------------------------------------------------------------------- atomicity


def test_overwrite_replaces_snapshot_and_leaves_no_temp_dirs(tmp_path, snap_dir):
    other = small_model(seed=1)
    save_snapshot(snap_dir, other, tokenizer_for(other), step=8)
    snap = load_snapshot(snap_dir)
    assert snap.step == 8
    assert torch.equal(snap.model.W_out, other.W_out)
    assert [p.name for p in tmp_path.iterdir()] == ["snap"]


def test_crash_during_rename_keeps_previous_snapshot(tmp_path, monkeypatch):
    run = tmp_path / "run"
    first = small_model(seed=0)
    save_snapshot(run / snapshot_name(0), first, tokenizer_for(first), step=0)
    save_snapshot(run / snapshot_name(500), first, tokenizer_for(first), step=500)
    real_replace = os.replace

    def crash_on_install(src, dst):
        if Path(src).name.startswith(f".{snapshot_name(500)}.tmp-"):
            raise OSError("simulated crash while renaming into place")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", crash_on_install)
    second = small_model(seed=1)
    with pytest.raises(CheckpointError, match="simulated crash.*earlier snapshot is intact"):
        save_snapshot(run / snapshot_name(500), second, tokenizer_for(second), step=501)
    monkeypatch.undo()
    assert sorted(p.name for p in run.iterdir()) == ["step_000000", "step_000500"]
    snap = load_checkpoint(run)
    assert snap.step == 500
    assert torch.equal(snap.model.W_out, first.W_out)


def test_crash_between_renames_leaves_run_loadable(tmp_path, monkeypatch):
    """A hard kill after the old snapshot was set aside: the dot-dir is ignored, no rollback ran."""
    run = tmp_path / "run"
    model = small_model()
    save_snapshot(run / snapshot_name(0), model, tokenizer_for(model), step=0)
    save_snapshot(run / snapshot_name(500), model, tokenizer_for(model), step=500)
    (run / snapshot_name(500)).rename(run / f".{snapshot_name(500)}.old-12345")
    (run / f".{snapshot_name(500)}.tmp-12345").mkdir()
    assert list_snapshots(run) == [run / "step_000000"]
    assert load_checkpoint(run).step == 0
    with pytest.raises(CheckpointError, match=r"\.step_000500\.old-12345"):
        load_snapshot(run / snapshot_name(500))
