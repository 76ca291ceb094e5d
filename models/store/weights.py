"""What every format's loader shares once it has a config and a state dict in our names.

``torch_load`` only ever unpickles with ``weights_only=True`` and turns any failure into one
:class:`~models.store.files.CheckpointError` line; ``build_and_load`` checks names and shapes on
a model built on the meta device (no memory, no random init), then loads by assignment with a
strict ``load_state_dict`` that names the first offending tensor;
(``models.store.front.parse_config`` validates a model config.)
"""

from __future__ import annotations

import errno
import logging
import pickle
import re
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from models import build_model
from models.config import ModelConfig
from models.store.files import CheckpointError

__all__ = ["SkipInit", "build_and_load", "load_weights", "strip_prefixes", "torch_load"]

logger = logging.getLogger(__name__)


class SkipInit(TorchFunctionMode):
    """Inside it, torch.nn.init's fills leave their tensor as it is. A meta skeleton's values are
    never read, and a meta `normal_` imports torch._dynamo: 1-3 s on a CLI's clock. A mode, not a
    patch of torch.nn.init: it holds on this thread only."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return kwargs["tensor"] if "tensor" in kwargs else args[0]
        return func(*args, **kwargs)


def build_and_load(config: ModelConfig, state: dict[str, Any], source: Path, *,
                   exact_names: bool, described_by: Path | None = None) -> torch.nn.Module:
    """The model of `config` holding the tensors of `state`. It is built on the meta device (no
    memory, no random init), its names and shapes checked against `state` (so a config that does
    not fit the weights, n_layers=3000 say, fails in one line before anything is allocated), then
    loaded with ``assign=True``: the parameters are the loaded tensors, not copies of them. A
    config that cannot be built at all is one CheckpointError naming `described_by` (the file the
    config came from; default `source`)."""
    check_counts(config, state, source)
    try:
        with torch.device("meta"), SkipInit():
            model = build_model(config)
        check_state(expected_state(model, state), state, source, exact_names=exact_names)
    except (RuntimeError, MemoryError) as exc:
        raise CheckpointError(f"{described_by or source}: cannot build the model it describes "
                              f"({' '.join(str(exc).split())[:200]})") from None
    load_weights(model, state, source, exact_names=exact_names)
    return model


def expected_state(model: torch.nn.Module, state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """What `state` must match: the model's state dict (per-head names, as our files hold them),
    or, when `state` already holds packed ``W_QKV`` (a GPT-2 layout's c_attn), the parameters as
    they sit in memory (the model has no buffers)."""
    if any(isinstance(k, str) and k.endswith(".W_QKV") for k in state):
        return {**dict(model.named_parameters()), **dict(model.named_buffers())}
    return model.state_dict()


def check_counts(config: ModelConfig, state: dict[str, Any], source: Path) -> None:
    """A config with more blocks or heads than the tensor names show is refused before building
    anything (even on the meta device, thousands of blocks take minutes to construct)."""
    for what, pattern, want in (("blocks", r"blocks\.(\d+)\.", getattr(config, "n_layers", None)),
                                ("heads", r"blocks\.0\.attention\.heads\.(\d+)\.", getattr(config, "n_heads", None))):
        found = {int(m.group(1)) for key in state if isinstance(key, str) and (m := re.match(pattern, key))}
        if found and want is not None and max(found) + 1 < want:  # fewer: the meta check names the tensor
            raise CheckpointError(f"{source}: the config has {want} {what} but the weights have "
                                  f"{max(found) + 1}: they belong to another model")


def load_weights(model: torch.nn.Module, state: dict[str, Any], source: Path, *,
                 exact_names: bool) -> None:
    """strict=True load (by assignment into a model on the meta device, else by copy); a mismatch
    names the first offending tensor (and both shapes)."""
    expected = expected_state(model, state)
    check_state(expected, state, source, exact_names=exact_names)
    note_low_precision(expected, state, source)
    meta = any(p.is_meta for p in model.parameters())
    try:
        model.load_state_dict(state, strict=True, assign=meta)
        if meta:  # assigned tensors keep the file's dtype: float16 weights become float32 here
            model.to(dtype=torch.float32)
    except RuntimeError as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        detail = lines[1] if len(lines) > 1 else (lines[0] if lines else type(exc).__name__)
        raise CheckpointError(f"{source}: state dict does not match the config: "
                              f"{detail[:400]}") from None


def check_state(expected: dict[str, torch.Tensor], state: dict[str, Any], source: Path, *,
                exact_names: bool) -> None:
    """Every entry a tensor of the shape the config expects (and, if exact, the same names)."""
    for name, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            raise CheckpointError(f"{source}: entry {name!r} is a {type(tensor).__name__}, not a tensor")
    for name, want in expected.items():  # in the model's state_dict order
        if name in state and state[name].shape != want.shape:
            raise CheckpointError(f"{source}: tensor {name!r} has shape {list(state[name].shape)} "
                                  f"but the config expects {list(want.shape)}")
        if name in state and want.is_floating_point() and not state[name].is_floating_point():
            raise CheckpointError(f"{source}: tensor {name!r} is stored as {_dtype(state[name])}, "
                                  f"but the model expects floating-point weights ({_dtype(want)}): "
                                  "the file is corrupt or was not written from a model")
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
    elif len(expected) > 2 * len(state) + 8:  # a series .pt: names differ, counts cannot
        raise CheckpointError(f"{source}: the config expects {len(expected)} tensors, the file has "
                              f"{len(state)}: it is a smaller model than the config says")


def note_low_precision(expected: dict[str, torch.Tensor], state: dict[str, Any], source: Path) -> None:
    """float16/bfloat16 weights load (upcast by load_state_dict): said in one line per load."""
    low = [name for name, want in expected.items() if name in state and want.is_floating_point()
           and state[name].dtype in (torch.float16, torch.bfloat16) and want.dtype == torch.float32]
    if low:
        kinds = sorted({_dtype(state[name]) for name in low})
        logger.warning("%s: %d of %d tensors are stored as %s; loaded as float32", source, len(low),
                       len(expected), " and ".join(kinds))


def _dtype(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def strip_prefixes(state: dict[str, Any]) -> dict[str, Any]:
    """The state dict without the name prefix torch.compile (``_orig_mod.``) or DDP (``module.``)
    leaves on every key."""
    for prefix in ("_orig_mod.", "module."):
        if state and all(isinstance(k, str) and k.startswith(prefix) for k in state):
            state = {k[len(prefix):]: v for k, v in state.items()}
    return dict(state)


def torch_load(path: Path, device: str | torch.device = "cpu") -> Any:
    """``torch.load(weights_only=True)``; any failure becomes one CheckpointError line."""
    try:
        with warnings.catch_warnings():  # e.g. "Detected pickle protocol 4": our one line says more
            warnings.simplefilter("ignore")
            return torch.load(path, map_location=device, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - untrusted file: every failure becomes one message
        why = (" (only tensors and plain containers are accepted; pickled objects are refused)"
               if isinstance(exc, pickle.UnpicklingError) else "")
        summary = _torch_error_summary(exc)
        if _cut_short(exc):  # "[Errno 22] Invalid argument" said nothing of the file
            summary = f"the file is truncated or damaged: not a whole archive as torch.save writes one ({summary})"
        raise CheckpointError(f"{path}: cannot load with torch.load(weights_only=True): {summary}{why}") from None


def _cut_short(exc: BaseException) -> bool:
    """torch.load's errors on a zip archive cut short: an invalid seek (EINVAL) or no central directory."""
    return (isinstance(exc, OSError) and exc.errno == errno.EINVAL) or "central directory" in str(exc)


def _torch_error_summary(exc: BaseException) -> str:
    """The informative sentence of torch.load's long, multi-line error."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1]
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    return line.split(". ")[0].rstrip(".")[:300]

