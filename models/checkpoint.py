"""The names every caller has used for checkpoints (they live in :mod:`models.store` now) and
the ``--ckpt`` resolution every CLI uses.

``from models.checkpoint import load_checkpoint, save_snapshot`` (the README, the notebook, users)
keeps working: the formats, their detection and the one :class:`Snapshot` result are in
:mod:`models.store`, re-exported here. Nothing is ever unpickled with ``weights_only=False``.
"""


from __future__ import annotations

import argparse

import torch

from models.cli import add_ckpt_arguments  # noqa: F401  (torch-free, re-exported here)
from models.store.files import CheckpointError
from models.store.load import load_checkpoint
from models.store.result import Snapshot
from models.store.run import (append_metrics, is_run_dir, is_snapshot_dir, latest_snapshot,  # noqa: F401
                              list_snapshots, read_metrics, read_run_json, snapshot_name,
                              snapshot_step, write_run_json)
from models.store.series import VOCAB_FILE, load_series_state_dict  # noqa: F401
from models.store.front import CONFIG_FILE, FORMAT_VERSION, MODEL_FILE  # noqa: F401
from models.store.snapshot import (OPTIMIZER_FILE, load_optimizer_state, load_snapshot,  # noqa: F401
                                   save_snapshot)

__all__ = ["CONFIG_FILE", "FORMAT_VERSION", "MODEL_FILE", "OPTIMIZER_FILE", "VOCAB_FILE",
           "CheckpointError", "Snapshot", "add_ckpt_arguments", "append_metrics", "is_run_dir",
           "is_snapshot_dir", "latest_snapshot", "list_snapshots", "load_checkpoint",
           "load_from_args", "load_optimizer_state", "load_series_state_dict", "load_snapshot",
           "read_metrics", "read_run_json", "resolve_device", "save_snapshot", "snapshot_name",
           "snapshot_step", "write_run_json"]


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
    """The Snapshot named by parsed --ckpt/--preset/--config/--tokenizer/--model-code/--device."""
    try:
        device = resolve_device(getattr(args, "device", "auto"))
    except ValueError as exc:
        raise CheckpointError(str(exc)) from None
    return load_checkpoint(args.ckpt, preset=getattr(args, "preset", None),
                           config=getattr(args, "config", None), device=device,
                           tokenizer=getattr(args, "tokenizer", None), model_code=getattr(args, "model_code", None))
