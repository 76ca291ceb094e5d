"""The values a loop hands the Monitor and the guard, checked the same way for both and refused in
one line: a logged number, a step, an integer setting, a name the Monitor writes itself, the torch
optimizer inside a wrapper. Below both (`train.monitor`, `train.guard`): it imports neither."""

from __future__ import annotations

import numbers
from typing import Any

import torch

__all__ = ["INT64_MAX", "OWNED", "first_optimizer", "number", "refuse_owned", "setting", "short", "step_number"]


def first_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer itself: accelerate's AcceleratedOptimizer and Lightning's wrappers hold
    it as `.optimizer`, and only the inner one runs its step hooks."""
    seen = optimizer
    for _ in range(16):  # wrappers nest a few deep; an object that holds itself must not hang us
        if isinstance(seen, torch.optim.Optimizer) and not isinstance(getattr(seen, "optimizer", None),
                                                                      torch.optim.Optimizer):
            return seen
        inner = getattr(seen, "optimizer", None)
        if inner is None or inner is seen:
            break
        seen = inner
    raise TypeError(f"Monitor: expected a torch optimizer (or a wrapper holding one as .optimizer), "
                    f"got {type(optimizer).__name__}")


# names the Monitor writes itself, in shapes every reader checks (models.store.record_check): a
# value logged under one would make the record unreadable, and its step's loss lost with it
OWNED = ("gwu", "activations", "attn_entropy", "attn_logit_max", "resid_rms", "diverged", "lr_groups", "rescue")
INT64_MAX = 2**63 - 1  # the readers' integer columns (the app's run list) are 64-bit


def refuse_owned(names: Any) -> None:
    """A value logged under one of `OWNED` refused in one line (checked once per log call)."""
    for name in names:
        if name in OWNED:
            raise ValueError(f"Monitor.log: {name!r} is a name the Monitor writes itself (one of "
                             f"{', '.join(OWNED)}): log your value under another name")


def number(name: str, value: Any) -> float | int | None:
    """A logged value as a plain number: a 0-d tensor (or a one-element numpy array) is read (one
    device sync), a numpy scalar becomes a Python one, None stays None (not measured)."""
    if isinstance(value, torch.Tensor) or (type(value).__module__ == "numpy" and hasattr(value, "item")):
        if getattr(value, "is_meta", False) or (getattr(value, "size", 1) if not isinstance(value, torch.Tensor)
                                                else value.numel()) != 1:
            what = "a meta tensor" if getattr(value, "is_meta", False) else f"an array of shape {list(value.shape)}"
            raise ValueError(f"Monitor.log: {name} must be one number, got {what}")
        value = value.item()
    if value is None or (isinstance(value, float) and not isinstance(value, bool)):
        return value
    if isinstance(value, numbers.Real) and not isinstance(value, bool):  # int, numpy's float32, int64, ...
        if not isinstance(value, numbers.Integral):
            try:
                return float(value)
            except OverflowError:  # a Fraction or Decimal-like past any float
                raise ValueError(f"Monitor.log: {name} is too large for a float, got {type(value).__name__}") from None
        if abs(int(value)) > INT64_MAX:
            raise ValueError(f"Monitor.log: {name} must fit in 64 bits, got an integer of {int(value).bit_length()} bits")
        return int(value)
    raise ValueError(f"Monitor.log: {name} must be a number, got {type(value).__name__} {short(value)}")


def short(value: Any) -> str:
    try:
        text = repr(value)
    except ValueError:  # an int past Python's digit limit for str()
        return f"(an integer of {value.bit_length()} bits)" if isinstance(value, int) else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def step_number(step: Any) -> int:
    """A logged step as an int: a Python or numpy integer, >= 0 and within 64 bits."""
    if isinstance(step, numbers.Integral) and not isinstance(step, bool):
        step = int(step)
        if 0 <= step <= INT64_MAX:
            return step
        if step > INT64_MAX:
            raise ValueError(f"Monitor.log: step must be below 2**63 (the readers' 64-bit columns), "
                             f"got an integer of {step.bit_length()} bits")
    hint = " (a tensor: pass step.item())" if isinstance(step, torch.Tensor) else ""
    raise ValueError(f"Monitor.log: step must be a non-negative integer (an int), got {type(step).__name__} {short(step)}{hint}")


def setting(name: str, value: Any, low: int = 0, none: bool = False) -> int | None:
    """One of the Monitor's integer settings (a Python or numpy int, low..2**63-1), or None if allowed."""
    if value is None and none:
        return None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and low <= int(value) <= INT64_MAX:
        return int(value)
    raise ValueError(f"Monitor: {name} must be an integer >= {low} (and below 2**63){' or None' if none else ''}, "
                     f"got {short(value)}")
