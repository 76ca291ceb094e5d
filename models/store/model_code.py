"""The user's own model code, run only on their explicit word (`--model-code`): a snapshot of any
model rebuilt from it with the snapshot's weights.

    rebuild("path/to/mygpt.py:GPT", {"n_layers": 2}, state, snapshot_dir)   # GPT(n_layers=2), weights loaded

The spec is ``FILE.py:NAME`` (a file, imported with its folder first on the import path, so its
own imports of files beside it work) or ``package.module:NAME`` (an importable module). NAME is a
class or a function returning the model; it is called with the keyword arguments the Monitor
recorded (`model_args=`), or with none. The weights load with `strict=True`: a module whose
names or shapes differ is refused in one line. Nothing here runs unless a spec is given.
"""

from __future__ import annotations

import importlib
import importlib.util
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


def build(spec: str, model_args: dict[str, Any] | None) -> torch.nn.Module:
    """The module NAME(**model_args) of the spec's file or module; one line for any failure."""
    where, name = parse_spec(spec)
    try:
        module = _module(where, spec)
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - their code: whatever it raises is said in one line
        raise CheckpointError(f"--model-code {spec!r}: importing {where} failed: {type(exc).__name__}: "
                              f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}") from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise CheckpointError(f"--model-code {spec!r}: {where} has no class or function named {name}")
    args = model_args or {}
    try:
        model = factory(**args)
    except Exception as exc:  # noqa: BLE001
        given = f"model_args {sorted(args)}" if args else "no arguments (the Monitor recorded no model_args=)"
        raise CheckpointError(f"--model-code {spec!r}: {name}() with {given} failed: {type(exc).__name__}: "
                              f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}") from None
    if not isinstance(model, torch.nn.Module):
        raise CheckpointError(f"--model-code {spec!r}: {name}() returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def rebuild(spec: str, model_args: dict[str, Any] | None, state: dict[str, torch.Tensor],
            directory: Path) -> torch.nn.Module:
    """The user's model built from `spec` with the snapshot's weights, loaded strictly."""
    model = build(spec, model_args)
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


def _key_lists(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> tuple[list[str], list[str]]:
    mine = set(model.state_dict())
    return sorted(mine - set(state)), sorted(set(state) - mine)


def _few(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
