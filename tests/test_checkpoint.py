"""Snapshots, run directories and --ckpt resolution (models/store/)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import pickle
from pathlib import Path

import pytest
import torch

from models import build_model, get_preset
from models.checkpoint import (CheckpointError, Snapshot, add_ckpt_arguments, append_metrics,
                               is_run_dir, is_snapshot_dir, latest_snapshot, list_snapshots,
                               load_checkpoint, load_from_args, load_optimizer_state,
                               load_series_state_dict, load_snapshot, read_metrics,
                               resolve_device, save_snapshot, snapshot_name)
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


# --------------------------------------------------------------------------- runs


def test_run_dir_latest_snapshot(tmp_path, model):
    run = tmp_path / "run"
    assert snapshot_name(500) == "step_000500" and snapshot_name(1234567) == "step_1234567"
    for step in (0, 500, 1000):
        with torch.no_grad():
            model.W_out.fill_(step)
        save_snapshot(run / snapshot_name(step), model, tokenizer_for(model), step=step)
    (run / "notes").mkdir()
    assert is_run_dir(run) and not is_snapshot_dir(run)
    assert is_snapshot_dir(run / "step_000500") and not is_run_dir(run / "step_000500")
    assert [p.name for p in list_snapshots(run)] == ["step_000000", "step_000500", "step_001000"]
    assert latest_snapshot(run) == run / "step_001000"
    snap = load_checkpoint(run)
    assert snap.step == 1000 and snap.name == "run/step_001000"
    assert snap.model.W_out[0, 0].item() == 1000.0


def test_empty_run_dir(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text("{}")
    with pytest.raises(CheckpointError, match="run directory has no step_NNNNNN snapshots yet"):
        load_checkpoint(tmp_path / "run")


def test_metrics_append_read_and_truncated_last_line(tmp_path, caplog):
    run = tmp_path / "run"
    assert read_metrics(tmp_path) == []
    for step in range(3):
        append_metrics(run, {"step": step, "loss": 4.0 - step, "entropy": torch.tensor([0.5, 1.0])})
    records = read_metrics(run)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert records[2] == {"step": 2, "loss": 2.0, "entropy": [0.5, 1.0]}
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "lo')  # killed mid-write
    with caplog.at_level(logging.WARNING, logger="models.store.run"):
        assert [r["step"] for r in read_metrics(run)] == [0, 1, 2]
    assert "truncated last line 4" in caplog.text
    append_metrics(run, {"step": 3, "loss": float("nan")})  # drops the partial record first
    records = read_metrics(run)
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert records[3]["loss"] != records[3]["loss"]  # NaN survives


def test_metrics_bad_lines_in_the_middle_are_skipped_with_file_and_line(tmp_path, caplog):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1,,}\n{"step": "many"}\n'
                                            '[1, 2]\n{"step": -5}\n{"step": 2}\n')
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 2]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    for line in (2, 3, 4, 5):
        assert any(f"metrics.jsonl: skipping line {line} " in w for w in warnings), warnings
    assert any("'step' must be a non-negative integer, got 'many'" in w for w in warnings)


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
