"""Our snapshot directory: save (atomic, hash-recorded) and load (validated, hash-checked).

A snapshot directory holds ``config.json`` (format version, model config, tokenizer kind and
files, step, tokens seen, training config, sha256 of the weights, creation time),
``model.safetensors``, the tokenizer file(s) and optionally ``optimizer.pt`` (read with
``torch.load(weights_only=True)``). Nothing is ever unpickled with ``weights_only=False``.
"""

from __future__ import annotations

import logging
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from models.interrupts import deferred_signals
from models.store.files import (CheckpointError, current_umask, dumps_json, fsync_dir, fsync_file, sha256_of,
                                write_bytes_atomic, write_error)
from models.store.front import (CONFIG_FILE, FORMAT_VERSION, MODEL_FILE, load_snapshot_tokenizer, parse_config,
                               read_snapshot_meta)
from models.store.result import Snapshot
from models.store.weights import build_and_load, torch_load
from models.tokenizers import Tokenizer

logger = logging.getLogger(__name__)

__all__ = ["OPTIMIZER_FILE", "interrupted_hint", "load_optimizer_state", "load_snapshot", "read_safetensors",
           "save_snapshot"]

OPTIMIZER_FILE = "optimizer.pt"


# --------------------------------------------------------------------------- save


def state_dict_for_saving(model: torch.nn.Module) -> dict[str, torch.Tensor]:
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


def write_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> str:
    """A safetensors file, readable by all as any file the umask allows, fsynced; its sha256."""
    save_file(tensors, str(path), metadata={"format": "pt"})
    os.chmod(path, 0o666 & ~current_umask())  # safetensors creates 0600 whatever the umask
    fsync_file(path)
    return sha256_of(path)


def _write_snapshot_files(tmp: Path, model, tokenizer, meta: dict[str, Any], optimizer) -> None:
    meta["tensors_sha256"] = write_tensors(tmp / MODEL_FILE, state_dict_for_saving(model))
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
    new one is in place; on failure the old one is put back. A Ctrl-C or SIGTERM that comes
    meanwhile is held until this is done. ``optimizer`` may be an optimizer or its state_dict.
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
    return write_directory(target, lambda tmp: _write_snapshot_files(tmp, model, tokenizer, meta, optimizer),
                           snapshot_bytes(model, optimizer))


def write_directory(target: Path, fill: Any, needed: int) -> Path:
    """Write a snapshot directory atomically: `fill(tmp)` writes its files into ``.<name>.tmp-<pid>``
    beside the target, which is then renamed into place (`save_snapshot` says how). `needed`: about
    the bytes it takes, for the no-space message."""
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    aside = target.parent / f".{target.name}.old-{os.getpid()}"
    with deferred_signals():  # Ctrl-C / SIGTERM wait until the snapshot is in place (or abandoned)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            fill(tmp)
            _swap_into_place(tmp, target, aside)
        except (OSError, RuntimeError, SafetensorError) as exc:  # read-only, disk full, quota, I/O error
            shutil.rmtree(tmp, ignore_errors=True)  # before measuring what is free
            why = write_error(exc, target.parent, needed)  # names the run, not tmp
            raise CheckpointError(f"{why}: snapshot {target.name} not saved; any earlier snapshot is intact") from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    logger.info("saved snapshot %s", target)
    return target


def snapshot_bytes(model, optimizer=None) -> int:
    """About what a snapshot of `model` (and `optimizer`'s state) takes on disk: its tensors' bytes."""
    state = optimizer.state_dict() if hasattr(optimizer, "state_dict") else optimizer or {}
    tensors = list(model.state_dict().values()) + [t for per in (state.get("state") or {}).values()
                                                   for t in per.values() if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


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


def interrupted_hint(directory: Path) -> str:
    """'; an interrupted save left the previous version at ...' where a save killed mid-swap left
    `directory` renamed aside (``.<name>.old-<pid>``), else ''."""
    aside = sorted(directory.parent.glob(f".{directory.name}.old-*")) if directory.name else []
    return (f"; an interrupted save left the previous version at {aside[0]} (rename it back to "
            f"{directory.name} to read it)") if aside else ""


def load_snapshot(directory: str | Path, device: str | torch.device = "cpu") -> Snapshot:
    """Load a snapshot directory: validated config, hash-checked weights, tokenizer; eval mode."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: snapshot directory not found{interrupted_hint(directory)}")
    meta = read_snapshot_meta(directory)
    config = parse_config(meta["model"], directory / CONFIG_FILE)
    weights = directory / MODEL_FILE
    state = read_checked(weights, meta["tensors_sha256"], "the snapshot has no weights")
    tokenizer = load_snapshot_tokenizer(directory, meta["tokenizer"], config)
    model = build_and_load(config, state, weights, exact_names=True, described_by=directory / CONFIG_FILE)
    return Snapshot(model.to(device).eval(), tokenizer, config, meta, directory)


def read_checked(path: Path, recorded: Any, lacking: str) -> dict[str, torch.Tensor]:
    """A safetensors file of a snapshot whose sha256 config.json records (`recorded`); `lacking`
    says what a missing file means."""
    if not path.is_file():
        raise CheckpointError(f"{path}: missing; {lacking}")
    state = read_safetensors(path)
    digest = sha256_of(path)
    if digest != recorded:
        raise CheckpointError(f"{path}: sha256 mismatch: file hashes to {digest[:16]}..., "
                              f"{CONFIG_FILE} records {str(recorded)[:16]}... (the file was modified or corrupted)")
    return state


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors on the CPU; a truncated or corrupt file is one CheckpointError,
    one we may not read another (safetensors' own words for it may name another cause)."""
    try:
        open(path, "rb").close()
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read it ({(exc.strerror or str(exc)).lower()})") from None
    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{path}: truncated or corrupt safetensors file ({exc})") from None


def load_optimizer_state(directory: str | Path, device: str | torch.device = "cpu") -> dict | None:
    """The snapshot's optimizer state_dict (``weights_only=True``), or None if it has none."""
    path = Path(directory) / OPTIMIZER_FILE
    if not path.is_file():
        return None
    return torch_load(path, device)
