"""--ckpt resolution and the CLI helpers (models/store/): arguments, devices, garbage files, and a
snapshot's encode of text.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch
from checkpoint_kit import PRESET, model, snap_dir  # noqa: F401 - fixtures

from models.checkpoint import (CheckpointError, add_ckpt_arguments, load_checkpoint, load_from_args,
                               load_snapshot, resolve_device)


# --------------------------------------------------------------------------- CLI helpers


def test_ckpt_arguments_and_load_from_args(snap_dir):
    parser = argparse.ArgumentParser()
    add_ckpt_arguments(parser)
    for action in parser._actions[1:]:
        assert action.help
    args = parser.parse_args(["--ckpt", str(snap_dir), "--device", "cpu"])
    assert (args.preset, args.config) == (None, None)
    assert load_from_args(args).step == 7
    assert parser.parse_args(["--ckpt", "x"]).device == "auto"
    with pytest.raises(SystemExit):
        parser.parse_args([])


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    with pytest.raises(ValueError, match="unknown device 'toaster'"):
        resolve_device("toaster")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")


def test_garbage_and_truncated_pt_files(tmp_path, model):
    (tmp_path / "garbage.pt").write_bytes(b"garbage")
    torch.save(model.state_dict(), tmp_path / "ok.pt")
    data = (tmp_path / "ok.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    for name in ("garbage.pt", "cut.pt"):
        with pytest.raises(CheckpointError) as info:
            load_checkpoint(tmp_path / name, preset=PRESET)
        message = str(info.value)
        assert f"{name}: cannot load with torch.load(weights_only=True): " in message
        assert "\n" not in message and "\x1b" not in message
        assert ("the file is truncated or damaged" in message) == (name == "cut.pt")  # not "[Errno 22] ..." alone


def test_config_that_cannot_be_built_is_a_checkpoint_error(snap_dir, monkeypatch):
    """config.json is not covered by the weights' hash: an absurd size must not be a traceback."""
    import models.store.weights as weights  # where the model is built (after a shape check on meta)

    def too_big(config):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: not enough memory")

    monkeypatch.setattr(weights, "build_model", too_big)
    with pytest.raises(CheckpointError, match=r"config\.json: cannot build the model it describes"):
        load_snapshot(snap_dir)


def test_snapshot_encode_gives_a_batch_the_model_and_probes_take():
    """`snap.encode("ROMEO:")` on a shipped character run: [1 pos] ids whose decode is the text,
    the same ids as the tokenizer's, and the probes' results equal those on the raw ids."""
    from probes import entropy
    snap = load_checkpoint(Path(__file__).resolve().parents[1] / "checkpoints" / "shakespeare_rms4")
    tokens = snap.encode("ROMEO:")
    assert tokens.shape == (1, 6) and tokens.dtype == torch.long
    assert tokens[0].tolist() == snap.tokenizer.encode("ROMEO:")
    assert snap.decode(tokens) == "ROMEO:" == snap.decode(tokens[0].tolist())
    assert snap.model(tokens).shape == (1, 6, snap.config.d_vocab)
    by_text = entropy.run(snap.model, snap.encode("ROMEO: But soft"))
    by_ids = entropy.run(snap.model, torch.tensor([snap.tokenizer.encode("ROMEO: But soft")]))
    assert by_text.entropy == by_ids.entropy


@pytest.mark.parametrize("text, message", [("", "non-empty"), (None, "non-empty"), ("ROMEO\u00e9", "not in the vocabulary")])
def test_snapshot_encode_refuses_bad_text_in_one_line(text, message):
    snap = load_checkpoint(Path(__file__).resolve().parents[1] / "checkpoints" / "shakespeare_rms4")
    with pytest.raises(ValueError, match=message) as info:
        snap.encode(text)
    assert "\n" not in str(info.value)


def test_snapshot_without_tokenizer_says_so(tmp_path, model):
    path = tmp_path / "bare.pt"
    torch.save(model.state_dict(), path)
    snap = load_checkpoint(path, preset=PRESET)
    with pytest.raises(ValueError, match="no tokenizer"):
        snap.encode("ab")
