"""Snapshots (save/load, atomic, hash-checked) and the ``--ckpt`` resolution every CLI uses.

A snapshot directory holds ``config.json`` (format version, model config, tokenizer kind and
files, step, tokens seen, training config, sha256 of the weights, creation time),
``model.safetensors``, the tokenizer file(s) and optionally ``optimizer.pt``. ``--ckpt`` accepts
a snapshot, a run directory (its latest snapshot) or a series ``.pt`` state dict with
``--preset``/``--config``. Nothing is ever unpickled with ``weights_only=False``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import pickle
import re
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from models import build_model, config_from_dict, get_preset
from models.config import ModelConfig
from models.runs import (CheckpointError, append_metrics, dumps_json, fsync_dir, fsync_file,
                         is_run_dir, is_snapshot_dir, latest_snapshot, list_snapshots, read_metrics,
                         read_run_json, snapshot_name, snapshot_step, write_bytes_atomic,
                         write_run_json)
from models.tokenizers import CharTokenizer, Tokenizer, TokenizerError, load_tokenizer

logger = logging.getLogger(__name__)

__all__ = ["CONFIG_FILE", "FORMAT_VERSION", "MODEL_FILE", "OPTIMIZER_FILE", "CheckpointError",
           "Snapshot", "add_ckpt_arguments", "append_metrics", "is_run_dir", "is_snapshot_dir",
           "latest_snapshot", "list_snapshots", "load_checkpoint", "load_from_args",
           "load_optimizer_state", "load_series_state_dict", "load_snapshot", "read_metrics",
           "read_run_json", "resolve_device", "save_snapshot", "snapshot_name", "snapshot_step",
           "write_run_json"]

FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
VOCAB_FILE = "vocab.json"
REQUIRED_KEYS = ("format_version", "model", "tokenizer", "step", "tokens_seen", "tensors_sha256")


@dataclass(frozen=True, eq=False)
class Snapshot:
    """A loaded model (eval mode) with its tokenizer (None for a bare .pt), config and metadata."""

    model: torch.nn.Module
    tokenizer: Tokenizer | None
    config: ModelConfig
    meta: dict[str, Any]  # the parsed config.json (synthesised for a .pt)
    path: Path

    @property
    def name(self) -> str:
        """``run/step_000500`` for a snapshot of a run, otherwise the directory or file name."""
        if snapshot_step(self.path) is not None and self.path.parent.name:
            return f"{self.path.parent.name}/{self.path.name}"
        return self.path.name

    @property
    def step(self) -> int | None:
        return self.meta.get("step")

    @property
    def tokens_seen(self) -> int | None:
        return self.meta.get("tokens_seen")

    def nonfinite_params(self) -> list[str]:
        """Names of parameters/buffers holding NaN or inf (a diverged run loads; probes report it)."""
        return [name for name, t in self.model.state_dict().items()
                if t.is_floating_point() and not bool(torch.isfinite(t).all())]


# --------------------------------------------------------------------------- save


def _state_dict_for_saving(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors, each storage saved once: tied or view-sharing tensors are cloned."""
    out: dict[str, torch.Tensor] = {}
    seen: set[tuple[str, int]] = set()
    for name, tensor in model.state_dict().items():
        t = tensor.detach().to("cpu").contiguous()
        storage = t.untyped_storage()
        key = (str(t.device), storage.data_ptr())
        if key in seen or storage.nbytes() != t.numel() * t.element_size():
            t = t.clone()
            key = (str(t.device), t.untyped_storage().data_ptr())
        seen.add(key)
        out[name] = t
    return out


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_snapshot_files(tmp: Path, model, tokenizer, meta: dict[str, Any], optimizer) -> None:
    model_path = tmp / MODEL_FILE
    save_file(_state_dict_for_saving(model), str(model_path), metadata={"format": "pt"})
    fsync_file(model_path)
    meta["tensors_sha256"] = _sha256(model_path)
    if tokenizer is not None:
        tokenizer.save(tmp)  # atomic and fsynced by the tokenizer
    if optimizer is not None:
        state = optimizer.state_dict() if hasattr(optimizer, "state_dict") else optimizer
        with open(tmp / OPTIMIZER_FILE, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
    write_bytes_atomic(tmp / CONFIG_FILE, (dumps_json(meta, indent=2) + "\n").encode("utf-8"))
    fsync_dir(tmp)


def save_snapshot(directory: str | Path, model, tokenizer: Tokenizer | None, *, step: int = 0,
                  tokens_seen: int = 0, train_config: dict[str, Any] | None = None,
                  optimizer=None) -> Path:
    """Write a snapshot atomically: build it in ``.<name>.tmp-<pid>`` beside the target, then rename.

    An existing snapshot is renamed aside (``.<name>.old-<pid>``) first and deleted only once the
    new one is in place; on failure the old one is put back. ``optimizer`` may be an optimizer or
    its state_dict.
    """
    target = Path(directory)
    cfg = model.cfg
    if tokenizer is not None and tokenizer.vocab_size > cfg.d_vocab:
        raise ValueError(f"tokenizer has {tokenizer.vocab_size} tokens but the model's d_vocab is "
                         f"{cfg.d_vocab}")
    for name, value in (("step", step), ("tokens_seen", tokens_seen)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    meta = {"format_version": FORMAT_VERSION, "model": cfg.to_dict(),
            "tokenizer": None if tokenizer is None else
            {"kind": tokenizer.kind, "files": list(tokenizer.files)},
            "step": step, "tokens_seen": tokens_seen, "train_config": train_config,
            "tensors_sha256": None,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    aside = target.parent / f".{target.name}.old-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        _write_snapshot_files(tmp, model, tokenizer, meta, optimizer)
        _swap_into_place(tmp, target, aside)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    logger.info("saved snapshot %s (step %d)", target, step)
    return target


def _swap_into_place(tmp: Path, target: Path, aside: Path) -> None:
    had_old = target.exists()
    if had_old:
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(target, aside)
    try:
        os.replace(tmp, target)
    except BaseException:
        if had_old and not target.exists():
            os.replace(aside, target)
        raise
    fsync_dir(target.parent)
    if had_old:
        shutil.rmtree(aside, ignore_errors=True)


# --------------------------------------------------------------------------- load


def _read_meta(directory: Path) -> dict[str, Any]:
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{path}: missing; a snapshot directory needs {CONFIG_FILE}")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(meta).__name__}")
    missing = [key for key in REQUIRED_KEYS if key not in meta]
    if missing:
        raise CheckpointError(f"{path}: missing key(s) {missing}")
    if meta["format_version"] != FORMAT_VERSION:
        raise CheckpointError(f"{path}: unknown format_version {meta['format_version']!r} "
                              f"(this version of scratchscope reads {FORMAT_VERSION})")
    return meta


def _config_from(data: Any, source: Path) -> ModelConfig:
    try:
        return config_from_dict(data)
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"{source}: invalid model config: {exc}") from None


def _load_weights(model: torch.nn.Module, state: dict[str, Any], source: Path, *,
                  exact_names: bool) -> None:
    """strict=True load; a mismatch names the first offending tensor (and both shapes)."""
    expected = model.state_dict()
    for name, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            raise CheckpointError(f"{source}: entry {name!r} is a {type(tensor).__name__}, not a tensor")
    for name, want in expected.items():  # in the model's state_dict order
        if name in state and state[name].shape != want.shape:
            raise CheckpointError(f"{source}: tensor {name!r} has shape {list(state[name].shape)} "
                                  f"but the config expects {list(want.shape)}")
    if exact_names:
        missing = [k for k in expected if k not in state]
        unexpected = [k for k in state if k not in expected]
        if missing:
            name = missing[0]
            raise CheckpointError(f"{source}: tensor {name!r} (shape {list(expected[name].shape)}) is "
                                  f"missing; the config expects {len(expected)} tensors, the file "
                                  f"has {len(state)}")
        if unexpected:
            name = unexpected[0]
            raise CheckpointError(f"{source}: unexpected tensor {name!r} (shape "
                                  f"{list(state[name].shape)}) that the config has no place for")
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        detail = lines[1] if len(lines) > 1 else (lines[0] if lines else type(exc).__name__)
        raise CheckpointError(f"{source}: state dict does not match the config: "
                              f"{detail[:400]}") from None


def load_snapshot(directory: str | Path, device: str | torch.device = "cpu") -> Snapshot:
    """Load a snapshot directory: validated config, hash-checked weights, tokenizer; eval mode."""
    directory = Path(directory)
    if not directory.is_dir():
        aside = sorted(directory.parent.glob(f".{directory.name}.old-*"))
        hint = f"; an interrupted save left the previous version at {aside[0]}" if aside else ""
        raise CheckpointError(f"{directory}: snapshot directory not found{hint}")
    meta = _read_meta(directory)
    config = _config_from(meta["model"], directory / CONFIG_FILE)
    weights = directory / MODEL_FILE
    if not weights.is_file():
        raise CheckpointError(f"{weights}: missing; the snapshot has no weights")
    try:
        state = load_file(str(weights), device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{weights}: truncated or corrupt safetensors file ({exc})") from None
    digest = _sha256(weights)
    if digest != meta["tensors_sha256"]:
        raise CheckpointError(f"{weights}: sha256 mismatch: file hashes to {digest[:16]}..., "
                              f"{CONFIG_FILE} records {str(meta['tensors_sha256'])[:16]}... "
                              "(the file was modified or corrupted)")
    tokenizer = _load_snapshot_tokenizer(directory, meta["tokenizer"], config)
    model = build_model(config)
    _load_weights(model, state, weights, exact_names=True)
    return Snapshot(model.to(device).eval(), tokenizer, config, meta, directory)


def _load_snapshot_tokenizer(directory: Path, info: Any, config: ModelConfig) -> Tokenizer | None:
    if info is None:
        return None
    source = directory / CONFIG_FILE
    if not isinstance(info, dict) or "kind" not in info:
        raise CheckpointError(f"{source}: 'tokenizer' must be an object with a 'kind', got {info!r}")
    for name in info.get("files") or []:
        if not (directory / name).is_file():
            raise CheckpointError(f"{directory / name}: missing {info['kind']} tokenizer file")
    try:
        tokenizer = load_tokenizer(directory, info["kind"])
    except TokenizerError as exc:
        raise CheckpointError(f"{directory}: cannot load tokenizer: {exc}") from None
    if tokenizer.vocab_size > config.d_vocab:
        raise CheckpointError(f"{directory}: tokenizer has {tokenizer.vocab_size} tokens but the "
                              f"model's d_vocab is {config.d_vocab}")
    return tokenizer


def load_optimizer_state(directory: str | Path, device: str | torch.device = "cpu") -> dict | None:
    """The snapshot's optimizer state_dict (``weights_only=True``), or None if it has none."""
    path = Path(directory) / OPTIMIZER_FILE
    if not path.is_file():
        return None
    return _torch_load(path, device)


def _torch_load(path: Path, device: str | torch.device = "cpu") -> Any:
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - untrusted file: every failure becomes one message
        why = (" (only tensors and plain containers are accepted; pickled objects are refused)"
               if isinstance(exc, pickle.UnpicklingError) else "")
        raise CheckpointError(f"{path}: cannot load with torch.load(weights_only=True): "
                              f"{_torch_error_summary(exc)}{why}") from None


def _torch_error_summary(exc: BaseException) -> str:
    """The informative sentence of torch.load's long, multi-line error."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1]
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    return line.split(". ")[0].rstrip(".")[:300]


def _unwrap_state_dict(obj: Any, path: Path) -> dict[str, Any]:
    """A plain state dict, or the one under "model"/"state_dict"; strips compile/DDP prefixes."""
    if isinstance(obj, dict):
        for key in ("model", "state_dict"):
            if isinstance(obj.get(key), dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not obj:
        raise CheckpointError(f"{path}: expected a state dict (name -> tensor), or a dict with a "
                              f"'model' or 'state_dict' entry; got {type(obj).__name__}")
    for prefix in ("_orig_mod.", "module."):
        if all(isinstance(k, str) and k.startswith(prefix) for k in obj):
            obj = {k[len(prefix):]: v for k, v in obj.items()}
    return dict(obj)


def load_series_state_dict(path: str | Path, config: ModelConfig, tokenizer: Tokenizer | None = None,
                           device: str | torch.device = "cpu") -> Snapshot:
    """Load a series ``.pt`` state dict into ``build_model(config)`` (strict); vocab.json beside it
    becomes the tokenizer unless one is given."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    state = _unwrap_state_dict(_torch_load(path), path)
    if tokenizer is None and (path.parent / VOCAB_FILE).is_file():
        try:
            tokenizer = CharTokenizer.load(path.parent)
        except TokenizerError as exc:
            raise CheckpointError(f"{path.parent / VOCAB_FILE}: {exc}") from None
    if tokenizer is not None and tokenizer.vocab_size > config.d_vocab:
        raise CheckpointError(f"{path}: tokenizer has {tokenizer.vocab_size} tokens but the config's "
                              f"d_vocab is {config.d_vocab}")
    model = build_model(config)
    _load_weights(model, state, path, exact_names=False)
    meta = {"format_version": None, "source": "series_pt", "model": config.to_dict(),
            "tokenizer": None if tokenizer is None else
            {"kind": tokenizer.kind, "files": list(tokenizer.files)},
            "step": None, "tokens_seen": None, "train_config": None}
    return Snapshot(model.to(device).eval(), tokenizer, config, meta, path)


def _config_file(path: Path) -> ModelConfig:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: config file not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    if isinstance(data, dict) and "format_version" in data and "model" in data:
        data = data["model"]  # a snapshot's config.json works too
    return _config_from(data, path)


def load_checkpoint(path: str | Path, *, preset: str | None = None, config: str | Path | None = None,
                    device: str | torch.device = "cpu") -> Snapshot:
    """Resolve ``--ckpt``: a snapshot directory, a run directory (its latest snapshot) or a series
    ``.pt`` state dict with ``preset`` (a preset name) or ``config`` (a JSON config file)."""
    path = Path(path)
    if is_snapshot_dir(path) or (path / MODEL_FILE).is_file():  # the latter: a broken snapshot
        if preset or config:
            logger.warning("ignoring --preset/--config: snapshot %s carries its own config", path)
        return load_snapshot(path, device)
    if is_run_dir(path):
        return load_snapshot(latest_snapshot(path), device)
    if path.is_file() and path.suffix in (".pt", ".pth", ".bin"):
        if config is not None:
            cfg = _config_file(Path(config))
        elif preset is not None:
            overrides = {}
            if (path.parent / VOCAB_FILE).is_file():
                try:
                    overrides["d_vocab"] = CharTokenizer.load(path.parent).vocab_size
                except TokenizerError as exc:
                    raise CheckpointError(f"{path.parent / VOCAB_FILE}: {exc}") from None
            try:
                cfg = get_preset(preset, **overrides)
            except ValueError as exc:
                raise CheckpointError(f"{path}: {exc}") from None
        else:
            raise CheckpointError(f"{path}: a series .pt needs --preset or --config")
        return load_series_state_dict(path, cfg, device=device)
    if not path.exists():
        raise CheckpointError(f"{path}: not found")
    raise CheckpointError(f"{path}: expected a snapshot directory (with {CONFIG_FILE}), a run "
                          "directory (with step_NNNNNN/ snapshots) or a series .pt state dict")


# --------------------------------------------------------------------------- CLI helpers


def add_ckpt_arguments(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    """Add --ckpt, --preset, --config and --device, the way every probe CLI takes a model."""
    parser.add_argument("--ckpt", required=required, metavar="PATH",
                        help="snapshot directory, run directory (its latest snapshot) or a series "
                             ".pt state dict (with --preset or --config)")
    parser.add_argument("--preset", metavar="NAME",
                        help="model preset for a .pt state dict "
                             "(see python -m models.info --list-presets)")
    parser.add_argument("--config", metavar="JSON",
                        help="model config JSON file for a .pt state dict ({\"family\": ..., ...})")
    parser.add_argument("--device", default="auto",
                        help="torch device: auto (cuda if available, else cpu), cpu, cuda, cuda:1, ...")


def resolve_device(name: str | None = "auto") -> torch.device:
    """'auto' -> cuda if available else cpu; otherwise validated (cuda without CUDA is an error)."""
    if name in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"unknown device {name!r} ({exc})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available; use --device cpu")
    return device


def load_from_args(args: argparse.Namespace) -> Snapshot:
    """The Snapshot named by parsed --ckpt/--preset/--config/--device."""
    try:
        device = resolve_device(getattr(args, "device", "auto"))
    except ValueError as exc:
        raise CheckpointError(str(exc)) from None
    return load_checkpoint(args.ckpt, preset=getattr(args, "preset", None),
                           config=getattr(args, "config", None), device=device)
