"""sweep.json checked field by field before anything reads it: `python -m probes.sweep`, the app's
Sweep page and `python -m train.sweep --resume` all read a sweep through `check_sweep`, so a file
damaged by hand, by a crash of another tool or by a merge gives one line naming the file and the
field (`runs[3].lr: expected a positive number, got '1e-2'`), never a KeyError or a format error
deep inside a table.

Torch-free, like the rest of the sweep's readers.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

__all__ = ["RUN_STATUSES", "SweepFileError", "check_sweep"]

RUN_STATUSES = ("pending", "running", "finished", "failed", "interrupted")
SWEEP_STATUSES = ("running", "finished", "interrupted")


class SweepFileError(ValueError):
    """A sweep.json that is not the shape `train.sweep` writes (one line: file and field)."""


Check = Callable[[Any], bool]


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _finite(v: Any) -> bool:  # JSON has no NaN, but Python's json module reads one
    return _number(v) and math.isfinite(v)


def _optional(check: Check) -> Check:
    return lambda v: v is None or check(v)


def _str(v: Any) -> bool:
    return isinstance(v, str)


def _folder_name(v: Any) -> bool:
    """A run's folder inside the sweep: one plain name, never a path out of it."""
    return isinstance(v, str) and v not in ("", ".", "..") and "/" not in v and "\\" not in v


def _str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


# (field, required, check, what the message asks for)
GRID = [("preset", True, _str, "a preset name"), ("data", True, _str, "a file path"),
        ("rates", True, lambda v: isinstance(v, list) and len(v) > 0 and all(_finite(r) and r > 0 for r in v),
         "a non-empty list of positive learning rates"),
        ("vary", False, lambda v: isinstance(v, dict) and all(_str_list(x) for x in v.values()),
         "a mapping of field to a list of values"),
        ("train_args", False, _str_list, "a list of flags")]
RUN = [("name", True, _str, "a run name"), ("lr", True, lambda v: _finite(v) and v > 0, "a positive number"),
       ("variant", True, _str, "a variant name"), ("dir", True, _folder_name, "a folder name inside the sweep"),
       ("status", True, lambda v: v in RUN_STATUSES, "one of " + ", ".join(RUN_STATUSES)),
       ("values", False, lambda v: isinstance(v, dict), "a mapping"),
       ("log", False, _optional(_str), "a file path"),
       ("exit_code", False, _optional(_int), "an integer or null"),
       ("seconds", False, _optional(_finite), "a number or null"),
       ("steps", False, _optional(_int), "an integer or null"),
       ("last_step", False, _optional(_int), "an integer or null"),
       ("diverged_at", False, _optional(_int), "an integer or null"),
       ("init_val_loss", False, _optional(_number), "a number or null"),
       ("final_val_loss", False, _optional(_number), "a number or null"),
       ("best_val_loss", False, _optional(_number), "a number or null"),
       ("verdict", False, _optional(_str), "a verdict or null"),
       ("diverged_by", False, _optional(_str), "a word or null"),
       ("rescues", False, _optional(_int), "an integer or null"),
       ("error", False, _optional(_str), "a line of text or null"),
       ("findings", False, _str_list, "a list of finding codes")]
RANGE = [("lo", True, _finite, "a number"), ("hi", True, _finite, "a number"),
         ("decades", True, _finite, "a number"), ("rates", True, _int, "an integer")]
VARIANT = [("name", True, _str, "a variant name"),
           ("lr_sensitivity", False, _optional(_number), "a number or null"),
           ("stable_range", False, lambda v: v is None or isinstance(v, dict), "a mapping or null"),
           ("best_lr", False, _optional(_finite), "a number or null"),
           ("best_val_loss", False, _optional(_number), "a number or null"),
           ("finished", False, _int, "an integer"), ("runs", False, _int, "an integer"),
           ("diverged", False, _int, "an integer")]


def _fields(obj: Any, spec: list, where: str, path: Path) -> None:
    if not isinstance(obj, dict):
        raise SweepFileError(f"{path}: {where} should be a mapping, got {type(obj).__name__}")
    for field, required, check, wanted in spec:
        if field not in obj:
            if required:
                raise SweepFileError(f"{path}: {where}{field} is missing (expected {wanted})")
            continue
        if not check(obj[field]):
            raise SweepFileError(f"{path}: {where}{field}: expected {wanted}, got {_shown(obj[field])}")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_sweep(data: Any, path: str | Path) -> dict[str, Any]:
    """`data` (sweep.json read as JSON) if it has the shape `train.sweep` writes, else
    SweepFileError naming `path` and the first bad field."""
    path = Path(path)
    if not isinstance(data, dict):
        raise SweepFileError(f"{path} is not a sweep's sweep.json: it holds a {type(data).__name__}, not a mapping")
    if "grid" not in data or "runs" not in data:
        raise SweepFileError(f"{path} is not a sweep's sweep.json (no grid and runs)")
    _fields(data["grid"], GRID, "grid.", path)
    if data.get("status") is not None and data["status"] not in SWEEP_STATUSES:
        raise SweepFileError(f"{path}: status: expected one of {', '.join(SWEEP_STATUSES)}, "
                             f"got {_shown(data['status'])}")
    for key in ("runs", "variants"):
        if key in data and not isinstance(data[key], list):
            raise SweepFileError(f"{path}: {key}: expected a list, got {type(data[key]).__name__}")
    names: set[str] = set()
    for i, run in enumerate(data["runs"]):
        _fields(run, RUN, f"runs[{i}].", path)
        if run["dir"] in names:
            raise SweepFileError(f"{path}: runs[{i}].dir: {run['dir']!r} is given to two runs")
        names.add(run["dir"])
    for i, variant in enumerate(data.get("variants", [])):
        _fields(variant, VARIANT, f"variants[{i}].", path)
        if variant.get("stable_range") is not None:
            _fields(variant["stable_range"], RANGE, f"variants[{i}].stable_range.", path)
    return data
