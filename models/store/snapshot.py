"""Snapshots (save/load, atomic, hash-checked) and the ``--ckpt`` resolution every CLI uses.

A snapshot directory holds ``config.json`` (format version, model config, tokenizer kind and
files, step, tokens seen, training config, sha256 of the weights, creation time),
``model.safetensors``, the tokenizer file(s) and optionally ``optimizer.pt``. ``--ckpt`` accepts
a snapshot, a run directory (its latest snapshot) or a series ``.pt`` state dict with
``--preset``/``--config``. Nothing is ever unpickled with ``weights_only=False``.

:class:`Snapshot` and the guarded weight loading live in :mod:`models.weights`, the series ``.pt``
loading in :mod:`models.series_ckpt`, run directories in :mod:`models.runs`; the names every
caller uses are re-exported here.
"""


from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from models.cli import add_ckpt_arguments  # noqa: F401  (torch-free, re-exported here)
from models.config import ModelConfig
from models.runs import (CheckpointError, append_metrics, current_umask, dumps_json, fsync_dir,
                         fsync_file, is_run_dir, is_snapshot_dir, latest_snapshot, list_snapshots,
                         read_json_object, read_metrics, read_run_json, snapshot_name, snapshot_step,
                         write_bytes_atomic, write_run_json)
from models.series_ckpt import (SERIES_SUFFIXES, VOCAB_FILE, load_series_checkpoint,
                                load_series_state_dict)
from models.tokenizers import Tokenizer, TokenizerError, load_tokenizer
from models.weights import Snapshot, build_and_load, parse_config, torch_load

logger = logging.getLogger(__name__)

__all__ = ["CONFIG_FILE", "FORMAT_VERSION", "MODEL_FILE", "OPTIMIZER_FILE", "VOCAB_FILE",
           "CheckpointError", "Snapshot", "add_ckpt_arguments", "append_metrics", "is_run_dir",
           "is_snapshot_dir", "latest_snapshot", "list_snapshots", "load_checkpoint",
           "load_from_args", "load_optimizer_state", "load_series_state_dict", "load_snapshot",
           "read_metrics", "read_run_json", "resolve_device", "save_snapshot", "snapshot_name",
           "snapshot_step", "write_run_json"]

FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
REQUIRED_KEYS = ("format_version", "model", "tokenizer", "step", "tokens_seen", "tensors_sha256")


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
    os.chmod(model_path, 0o666 & ~current_umask())  # safetensors creates 0600 whatever the umask
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
    except (OSError, RuntimeError, SafetensorError) as exc:  # disk full, quota, I/O error
        raise CheckpointError(f"cannot save snapshot {target}: {_first_line(exc)}; any earlier "
                              "snapshot is intact") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    logger.info("saved snapshot %s", target)
    return target


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


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
    meta = read_json_object(path)
    missing = [key for key in REQUIRED_KEYS if key not in meta]
    if missing:
        raise CheckpointError(f"{path}: missing key(s) {missing}")
    if meta["format_version"] != FORMAT_VERSION:
        raise CheckpointError(f"{path}: unknown format_version {meta['format_version']!r} "
                              f"(this version of scratchscope reads {FORMAT_VERSION})")
    for key in ("step", "tokens_seen"):
        value = meta.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise CheckpointError(f"{path}: '{key}' must be a non-negative integer, got {value!r}")
    return meta


def load_snapshot(directory: str | Path, device: str | torch.device = "cpu") -> Snapshot:
    """Load a snapshot directory: validated config, hash-checked weights, tokenizer; eval mode."""
    directory = Path(directory)
    if not directory.is_dir():
        aside = sorted(directory.parent.glob(f".{directory.name}.old-*"))
        hint = f"; an interrupted save left the previous version at {aside[0]}" if aside else ""
        raise CheckpointError(f"{directory}: snapshot directory not found{hint}")
    meta = _read_meta(directory)
    config = parse_config(meta["model"], directory / CONFIG_FILE)
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
    try:
        model = build_and_load(config, state, weights, exact_names=True)  # shapes checked on meta first
    except (RuntimeError, MemoryError) as exc:  # e.g. an absurd n_ctx or d_vocab in config.json
        raise CheckpointError(f"{directory / CONFIG_FILE}: cannot build the model it describes "
                              f"({' '.join(str(exc).split())[:200]})") from None
    return Snapshot(model.to(device).eval(), tokenizer, config, meta, directory)


def _load_snapshot_tokenizer(directory: Path, info: Any, config: ModelConfig) -> Tokenizer | None:
    if info is None:
        return None
    source = directory / CONFIG_FILE
    if not isinstance(info, dict) or "kind" not in info:
        raise CheckpointError(f"{source}: 'tokenizer' must be an object with a 'kind', got {info!r}")
    files = info.get("files") or []
    if not isinstance(files, list) or not all(isinstance(n, str) for n in files):
        raise CheckpointError(f"{source}: 'tokenizer.files' must be a list of file names, got {files!r}")
    for name in files:
        if Path(name).name != name or name in (".", ".."):  # no paths: nothing outside the snapshot
            raise CheckpointError(f"{source}: tokenizer file {name!r} must be a plain file name "
                                  "inside the snapshot directory")
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
    return torch_load(path, device)


def load_checkpoint(path: str | Path, *, preset: str | None = None, config: str | Path | None = None,
                    device: str | torch.device = "cpu") -> Snapshot:
    """Resolve ``--ckpt``: a snapshot directory, a run directory (its latest snapshot) or a series
    ``.pt`` state dict with ``preset`` (a preset name) or ``config`` (a JSON config file)."""
    path = Path(path)
    snapshot = is_snapshot_dir(path) or (path / MODEL_FILE).is_file()  # the latter: a broken snapshot
    if (snapshot or is_run_dir(path)) and (preset or config):
        logger.warning("ignoring --preset/--config: %s %s carries its own config",
                       "snapshot" if snapshot else "run", path)
    if snapshot:
        return load_snapshot(path, device)
    if is_run_dir(path):
        return load_snapshot(latest_snapshot(path), device)
    if path.is_file() and path.suffix in SERIES_SUFFIXES:
        return load_series_checkpoint(path, preset=preset, config=config, device=device)
    if not path.exists():
        raise CheckpointError(f"{path}: not found")
    raise CheckpointError(f"{path}: expected a snapshot directory (with {CONFIG_FILE}), a run "
                          "directory (with step_NNNNNN/ snapshots) or a series .pt state dict")


# --------------------------------------------------------------------------- CLI helpers


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
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {name!r} requested but Apple's MPS is not available here; use --device cpu")
    if device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device {name!r} cannot run a model here; use auto, cpu or cuda")
    _check_device_index(name, device)
    return device


def _check_device_index(name: str, device: torch.device) -> None:
    """torch accepts any index (cpu:1, cuda:7) and fails later, or never (cpu): refuse it here."""
    if device.index is None:
        return
    count = {"cpu": 1, "mps": 1}.get(device.type) or torch.cuda.device_count()
    if device.index >= count:
        have = "only cpu (or cpu:0)" if device.type == "cpu" else \
            f"{count} {device.type} device(s): {', '.join(f'{device.type}:{i}' for i in range(count))}"
        raise ValueError(f"device {name!r} does not exist: this machine has {have}")


def load_from_args(args: argparse.Namespace) -> Snapshot:
    """The Snapshot named by parsed --ckpt/--preset/--config/--device."""
    try:
        device = resolve_device(getattr(args, "device", "auto"))
    except ValueError as exc:
        raise CheckpointError(str(exc)) from None
    return load_checkpoint(args.ckpt, preset=getattr(args, "preset", None),
                           config=getattr(args, "config", None), device=device)
