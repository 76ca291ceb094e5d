"""``load_checkpoint``: what ``--ckpt`` names, detected and handed to its format's module.

- a directory with ``config.json``: our snapshot (``format_version``), a snapshot of any model
  (``"format": "any-model"``, the Monitor's save_every on a model of the user's own) or a Hugging
  Face GPT-2 directory (``model_type``) — :mod:`.snapshot`, :mod:`.any_model`, :mod:`.hf`;
- a run directory (its latest snapshot): ours, a folder of numbered nanoGPT checkpoints, or
  nanochat's ``dN`` folder of ``model_NNNNNN.pt`` — :mod:`.run`; a nanoGPT out_dir holding one
  ``ckpt.pt``: that file;
- nanochat's ``model_NNNNNN.pt`` with its ``meta_NNNNNN.json``: :mod:`.nanochat`;
- any other Hugging Face causal-LM directory: read through TransformerBridge, :mod:`.bridge`;
- a ``.pt`` file, read once with ``torch.load(weights_only=True)``: a nanoGPT checkpoint when
  it carries ``model_args`` (:mod:`.nanogpt`), else a series state dict with ``preset`` or
  ``config`` (:mod:`.series`); anything else is one line naming the keys it has.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from models.store.any_files import is_any_snapshot
from models.store.any_model import ANY_SOURCE, load_any_snapshot
from models.store.files import CheckpointError, read_json_object
from models.store.hf import is_hf_config, load_hf_gpt2, refuse_untyped
from models.store.nanochat_files import is_nanochat, meta_file
from models.store.nanogpt import is_nanogpt, load_nanogpt, why_not_nanogpt
from models.store.result import Snapshot
from models.store.run import SNAPSHOT_CONFIG, is_run_dir, latest_snapshot, read_run_json
from models.store.series import SERIES_SUFFIXES, load_series_checkpoint
from models.store.front import MODEL_FILE
from models.store.snapshot import interrupted_hint, load_snapshot
from models.store.weights import torch_load

__all__ = ["load_checkpoint"]

NANOGPT_FILE = "ckpt.pt"  # what nanoGPT's train.py writes into its out_dir


def load_checkpoint(path: str | Path, *, preset: str | None = None, config: str | Path | None = None,
                    device: str | torch.device = "cpu", tokenizer: str | Path | None = None,
                    model_code: str | None = None) -> Snapshot:
    """The checkpoint at `path` in any format we read (see the module doc). `preset` / `config`
    describe a series ``.pt`` (the other formats carry their own); `tokenizer` is a nanoGPT
    ``meta.pkl`` or a directory of GPT-2 tokenizer files for a nanoGPT checkpoint; `model_code`
    ("mygpt.py:GPT", the user's word) rebuilds a snapshot of any model from the user's code."""
    if not str(path).strip():  # Path("") is the current directory: never read it by accident
        raise CheckpointError("the checkpoint path is empty: give a snapshot or run directory, or a checkpoint file")
    path = Path(path)
    snap = _load(path, preset, config, device, tokenizer, model_code)
    if model_code and snap.meta.get("source") != ANY_SOURCE:
        raise CheckpointError(f"--model-code {model_code}: {path} is not a snapshot of any model (the Monitor's "
                              "save_every on a model of your own): it carries what builds it; leave --model-code out")
    return snap


def _load(path: Path, preset: str | None, config: Any, device: Any, tokenizer: Any, model_code: str | None) -> Snapshot:
    if path.is_dir():
        return _load_directory(path, preset, config, device, tokenizer, model_code)
    if path.is_file() and path.suffix in SERIES_SUFFIXES:
        return _load_pt(path, preset, config, device, tokenizer)
    if not path.exists():
        raise CheckpointError(f"{path}: not found{interrupted_hint(path)}")
    raise CheckpointError(f"{path}: expected a snapshot directory (with {SNAPSHOT_CONFIG}), a run "
                          "directory (with step_NNNNNN/ snapshots), a Hugging Face directory, a nanoGPT "
                          "ckpt.pt, nanochat's model_NNNNNN.pt or a series .pt state dict")


def _load_directory(path: Path, preset: str | None, config: Any, device: Any, tokenizer: Any,
                    model_code: str | None = None) -> Snapshot:
    if (path / SNAPSHOT_CONFIG).is_file():
        data = read_json_object(path / SNAPSHOT_CONFIG)
        refuse_untyped(data, path / SNAPSHOT_CONFIG)
        trained = data.get("train_config")
        recorded = trained.get("preset") if isinstance(trained, dict) else None
        _fixed(preset, config, "Hugging Face directory" if is_hf_config(data) else "snapshot", path, recorded)
        if is_any_snapshot(data):
            return load_any_snapshot(path, data, device, model_code)
        if not is_hf_config(data):
            return load_snapshot(path, device)
        if data.get("model_type") == "gpt2":  # rebuilt as ours
            return load_hf_gpt2(path, data, device)
        from models.store.bridge import load_hf_bridge  # imports transformers: only for these

        return load_hf_bridge(path, data, device)
    if (path / MODEL_FILE).is_file():  # a snapshot that lost its config.json: its loader says so
        _fixed(preset, config, "snapshot", path)
        return load_snapshot(path, device)
    if is_run_dir(path):
        _fixed(preset, config, "run", path, (read_run_json(path) or {}).get("preset"))
        latest = latest_snapshot(path)
        if latest.is_file():  # a folder of nanoGPT checkpoints: its highest step
            return _load_pt(latest, None, None, device, tokenizer)
        if (latest / SNAPSHOT_CONFIG).is_file():  # ours, or a snapshot of any model
            return _load_directory(latest, None, None, device, tokenizer, model_code)
        return load_snapshot(latest, device)  # says what it lacks
    if (path / NANOGPT_FILE).is_file():
        return _load_pt(path / NANOGPT_FILE, preset, config, device, tokenizer)
    models = sorted((p.name for p in path.iterdir()
                     if p.is_dir() and any(is_nanochat(f) for f in p.glob("model_*.pt"))),
                    key=lambda name: (len(name), name))  # d2 before d10
    if models:  # nanochat's base_checkpoints/: one folder per model depth
        raise CheckpointError(f"{path}: a folder of nanochat models ({', '.join(models)}): give one of them "
                              f"as --ckpt (its latest step), e.g. {path / models[-1]}")
    raise CheckpointError(f"{path}: expected a snapshot directory (with {SNAPSHOT_CONFIG}), a run "
                          "directory (with step_NNNNNN/ snapshots or numbered .pt files), a Hugging Face "
                          "directory (with config.json), a nanoGPT out_dir (with ckpt.pt) or nanochat's "
                          "dN folder")


def _fixed(preset: str | None, config: Any, kind: str, path: Path, recorded: Any = None) -> None:
    """--preset / --config describe a series .pt; a checkpoint carrying its own config fixes what they
    would say: refused, as a resumed run refuses a flag it fixes (the preset it records is accepted)."""
    flag = "--config" if config else "--preset" if preset and preset != recorded else None
    if flag:
        trained = f", trained as preset {recorded}" if recorded else ""
        raise CheckpointError(f"{flag} {config or preset}: {kind} {path} carries its own model config{trained}; "
                              f"leave {flag} out ({flag} describes a series .pt state dict)")


def _load_pt(path: Path, preset: str | None, config: Any, device: Any, tokenizer: Any) -> Snapshot:
    if is_nanochat(path):  # model_NNNNNN.pt with its meta_NNNNNN.json: built by nanochat's own code
        _fixed(preset, config, "nanochat checkpoint", path)
        from models.store.nanochat import load_nanochat  # builds with nanochat: only for these

        return load_nanochat(path, device)
    loaded = torch_load(path)  # weights_only=True: a file that needs more is refused in one line
    if is_nanogpt(loaded):
        _fixed(preset, config, "nanoGPT checkpoint", path)
        return load_nanogpt(path, loaded, device, tokenizer)
    if isinstance(loaded, dict) and "model_args" in loaded:  # nanoGPT's, with a part missing
        raise CheckpointError(f"{path}: not a whole nanoGPT checkpoint ({why_not_nanogpt(loaded)}): "
                              f"{_what_it_holds(loaded)}")
    if preset is None and config is None and meta_file(path) is not None:  # named as nanochat names its models
        raise CheckpointError(f"{path}: nanochat's meta file {meta_file(path).name} is missing beside it (nanochat's "
                              "save_checkpoint writes both; its model_config says how to build the GPT); a series "
                              ".pt of that name needs --preset or --config")
    if preset is None and config is None:
        raise CheckpointError(f"{path}: a series .pt needs --preset or --config, and it is not a "
                              f"nanoGPT checkpoint ({why_not_nanogpt(loaded)}): {_what_it_holds(loaded)}")
    return load_series_checkpoint(path, preset=preset, config=config, device=device, loaded=loaded)


def _what_it_holds(obj: Any) -> str:
    """The file's top level in a few words: its keys, or that it is a bare state dict."""
    if not isinstance(obj, dict):
        return f"holds a {type(obj).__name__}"
    keys = [str(k) for k in obj]
    shown = ", ".join(repr(k) for k in keys[:5]) + (", ..." if len(keys) > 5 else "")
    if obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        return f"a state dict of {len(keys)} tensors ({shown})"
    return f"its keys are [{shown}]"
