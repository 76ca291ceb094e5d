"""The user's own model code, run only on their explicit word (`--model-code`): a snapshot of any
model rebuilt from it with the snapshot's weights.

    rebuild("path/to/mygpt.py:GPT", {"n_layers": 2}, state, snapshot_dir)   # GPT(n_layers=2), weights loaded

The spec is ``FILE.py:NAME`` (a file, imported with its folder first on the import path, so its
own imports of files beside it work) or ``package.module:NAME`` (an importable module). NAME is a
class or a function returning the model; it is called with the keyword arguments the Monitor
recorded (`model_args=`), or with none. Only a snapshot whose recorded class is NAME (or, for a
function, whose model is of that class) is built; the model is built first on the meta device (no
memory: a `model_args` of `vocab: 3e8` would otherwise allocate 38 GB) and its names and shapes
compared with the weights, then built for real; the weights load with `strict=True`. A mismatch
is refused in one line. Nothing here runs unless a spec is given.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any

import torch

from models.store.files import CheckpointError

__all__ = ["parse_spec", "rebuild"]


def parse_spec(spec: str) -> tuple[str, str]:
    """(file or module, name) of ``FILE.py:NAME`` / ``module:NAME``; one line for anything else."""
    where, sep, name = str(spec).rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise CheckpointError(f"--model-code {spec!r}: expected FILE.py:NAME or module:NAME (the class or function "
                              "that builds your model), e.g. mygpt.py:GPT")
    return where, name


def _module(where: str, spec: str) -> Any:
    if where.endswith(".py") or "/" in where or "\\" in where:
        path = Path(where).expanduser().resolve()
        if not path.is_file():
            raise CheckpointError(f"--model-code {spec!r}: {path} is not a file")
        module_name = f"scratchscope_model_code.{path.stem}"
        loader = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(loader)
        sys.path.insert(0, str(path.parent))  # its own imports of files beside it
        sys.modules[module_name] = module  # dataclasses and pickling-free helpers look it up
        try:
            loader.loader.exec_module(module)
        finally:
            sys.path.remove(str(path.parent))
        return module
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # as `python -m` finds a module of the working folder
    return importlib.import_module(where)


def load_factory(spec: str) -> Any:
    """The class or function NAME of the spec's file or module (imported: their code runs here)."""
    where, name = parse_spec(spec)
    try:
        module = _module(where, spec)
    except CheckpointError:
        raise
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - their code: whatever it raises (sys.exit too) in one line
        raise CheckpointError(f"--model-code {spec!r}: importing {where} failed: {_said(exc)}") from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise CheckpointError(f"--model-code {spec!r}: {where} has no class or function named {name}")
    return factory


def _said(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"it called sys.exit({exc.code!r})"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def build(spec: str, model_args: dict[str, Any] | None, device: str | None = None,
          factory: Any = None) -> torch.nn.Module:
    """The module NAME(**model_args) of the spec's file or module (its `factory` when already
    imported), made on `device` (e.g. "meta"); one line for any failure."""
    where, name = parse_spec(spec)
    factory = load_factory(spec) if factory is None else factory
    args = model_args or {}
    if not isinstance(args, dict) or not all(isinstance(k, str) and k.isidentifier() for k in args):
        raise CheckpointError(f"--model-code {spec!r}: model_args must map argument names to values, got "
                              f"{type(args).__name__}")
    try:
        with torch.device(device) if device else contextlib.nullcontext():
            model = factory(**args)
    except (Exception, SystemExit) as exc:  # noqa: BLE001
        given = f"model_args {sorted(args)}" if args else "no arguments (the Monitor recorded no model_args=)"
        raise CheckpointError(f"--model-code {spec!r}: {name}() with {given} failed: {_said(exc)}") from None
    if not isinstance(model, torch.nn.Module):
        raise CheckpointError(f"--model-code {spec!r}: {name}() returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def rebuild(spec: str, model_args: dict[str, Any] | None, state: dict[str, torch.Tensor],
            directory: Path, recorded_class: str | None = None) -> torch.nn.Module:
    """The user's model built from `spec` with the snapshot's weights, loaded strictly: only when
    it is of the class the snapshot records, and after a build on the meta device fits the weights."""
    recorded = str(recorded_class or "").rsplit(".", 1)[-1]
    factory = load_factory(spec)
    if recorded and inspect.isclass(factory) and factory.__name__ != recorded:
        raise CheckpointError(f"--model-code {spec!r}: {directory.name} is a snapshot of a {recorded}, not of "
                              f"{factory.__name__}: give --model-code FILE.py:{recorded}")
    _check_args(model_args, max(sum(t.numel() for t in state.values()), MIN_BOUND), spec, directory)  # data from a file
    try:
        ghost = build(spec, model_args, device="meta", factory=factory)  # names and shapes, no memory
    except CheckpointError:
        ghost = None  # code that cannot run on the meta device: built for real below, then compared
    if ghost is not None:
        _check_fits(ghost, state, spec, directory, recorded)
    model = build(spec, model_args, factory=factory)
    _check_fits(model, state, spec, directory, recorded)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        missing, unexpected = _key_lists(model, state)
        sizes = [line.strip().rstrip(".") for line in str(exc).splitlines() if "size mismatch" in line]
        what = "; ".join(part for part in (
            f"missing {_few(missing)}" if missing else "", f"unexpected {_few(unexpected)}" if unexpected else "",
            _few(sizes) if sizes else "") if part) or str(exc).strip().splitlines()[0]
        raise CheckpointError(f"--model-code {spec!r} does not fit the weights of {directory.name}: {what}") from None
    return model


MIN_BOUND = 2**20  # a number in model_args up to this is always taken (a context of 1M positions)


def _check_args(args: Any, bound: int, spec: str, directory: Path, where: str = "model_args") -> None:
    """model_args are data from a file handed to the user's constructor: no number in them larger than
    the saved weights' element count (or MIN_BOUND), which a loop or an allocation would take."""
    if isinstance(args, dict):
        for key, value in list(args.items())[:10_000]:
            _check_args(value, bound, spec, directory, f"{where}.{key}")
    elif isinstance(args, (list, tuple)):
        for i, value in enumerate(args[:10_000]):
            _check_args(value, bound, spec, directory, f"{where}[{i}]")
    elif isinstance(args, (int, float)) and not isinstance(args, bool) and not abs(args) <= bound:
        raise CheckpointError(f"--model-code {spec!r}: {directory.name}/config.json's {where} is {args!r}, larger than "
                              f"{bound} (the most any size of it can be: the weights' count, at least 2**20): not built")


def _check_fits(model: torch.nn.Module, state: dict[str, torch.Tensor], spec: str, directory: Path,
                recorded: str) -> None:
    if recorded and type(model).__name__ != recorded:
        raise CheckpointError(f"--model-code {spec!r} builds a {type(model).__name__}, but {directory.name} is a "
                              f"snapshot of a {recorded}")
    mine = model.state_dict()
    missing, unexpected = _key_lists(model, state)
    shapes = [f"size mismatch for {n}: {list(mine[n].shape)} built, {list(state[n].shape)} saved"
              for n in sorted(set(mine) & set(state)) if tuple(mine[n].shape) != tuple(state[n].shape)]
    what = "; ".join(part for part in (f"missing {_few(missing)}" if missing else "",
                                       f"unexpected {_few(unexpected)}" if unexpected else "",
                                       _few(shapes) if shapes else "") if part)
    if what:
        raise CheckpointError(f"--model-code {spec!r} does not fit the weights of {directory.name}: {what}")


def _key_lists(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> tuple[list[str], list[str]]:
    mine = set(model.state_dict())
    return sorted(mine - set(state)), sorted(set(state) - mine)


def _few(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
