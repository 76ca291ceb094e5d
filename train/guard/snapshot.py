"""One state of a run held in host memory for the guard (`train.guard`): the model's parameters and
buffers, the optimizer's per-parameter state, a GradScaler's scale, and the learning rates of the
update that made it. Its host buffers are made once and refilled at each take; on a GPU they are
pinned and filled without waiting (the copy is queued on the stream, so the next step's kernels
run after it), and restoring copies back in place, so that the optimizer, DDP and any compiled
graph keep the tensors they hold. Nothing here touches a file.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["HostSnapshot", "SnapshotMismatch", "copy", "state_tensors"]


class SnapshotMismatch(ValueError):
    """The model or optimizer no longer has the tensors a snapshot was taken of."""


def state_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """What a snapshot holds, by name: the model's parameters and buffers under their own names,
    each optimizer state entry under `optimizer.<group>.<index>.<key>` (tensors and plain values)."""
    out: dict[str, Any] = {f"model.{n}": t for n, t in model.named_parameters()}
    out.update({f"model.{n}": t for n, t in model.named_buffers()})
    for g, group in enumerate(optimizer.param_groups):
        for i, p in enumerate(group["params"]):
            for key, value in optimizer.state.get(p, {}).items():
                out[f"optimizer.{g}.{i}.{key}"] = value
    return out


def _shape(value: Any) -> Any:
    return (tuple(value.shape), value.dtype) if isinstance(value, torch.Tensor) else type(value).__name__


class HostSnapshot:
    """One slot of the guard's ring: `take` copies the live state in, `restore` copies it back."""

    def __init__(self) -> None:
        self.step: int | None = None  # the step whose state it holds; None: empty
        self.lrs: list[Any] = []  # each group's learning rate the schedule set for the update that made it
        self.buffers: dict[str, torch.Tensor] = {}  # name -> host copy
        self.values: dict[str, Any] = {}  # name -> a plain optimizer value (a step count kept as int)
        self.shapes: dict[str, Any] = {}  # name -> (shape, dtype) or type name: what restore checks
        self.scaler: list[torch.Tensor] | None = None  # the scale and growth tracker, when there are

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers.values())

    def take(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             scaler: Any = None, lrs: list[Any] | None = None) -> None:
        live = state_tensors(model, optimizer)
        shapes = {name: _shape(value) for name, value in live.items()}
        if shapes != self.shapes:  # new or changed tensors (the optimizer's state appears at its first step)
            self.buffers = {name: torch.empty(v.shape, dtype=v.dtype, device="cpu", pin_memory=v.is_cuda)
                            for name, v in live.items() if isinstance(v, torch.Tensor)}
            self.shapes = shapes
        names = list(self.buffers)
        copy([self.buffers[n] for n in names], [live[n].detach() for n in names])
        self.values = {name: v for name, v in live.items() if not isinstance(v, torch.Tensor)}
        self.scaler = _scaler_copy(scaler, self.scaler)
        self.step, self.lrs = step, list(lrs or [])

    def mismatch(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str | None:
        """Why the live model and optimizer no longer fit this snapshot, or None: a parameter,
        buffer or optimizer entry added, gone, reshaped or of another dtype."""
        live = {name: _shape(value) for name, value in state_tensors(model, optimizer).items()}
        models = lambda d: {n: v for n, v in d.items() if n.startswith("model.")}  # noqa: E731
        if models(live) != models(self.shapes):
            return _difference(models(self.shapes), models(live), "the model")
        opt_live = {n for n in live if n.startswith("optimizer.")}
        for name in opt_live & set(self.shapes):
            if live[name] != self.shapes[name]:
                return _difference({name: self.shapes[name]}, {name: live[name]}, "the optimizer")
        groups = [len(g["params"]) for g in optimizer.param_groups]
        held = {int(n.split(".")[1]) for n in self.shapes if n.startswith("optimizer.")}
        if held and max(held) >= len(groups):
            return f"the optimizer has {len(groups)} param groups, the snapshot has state for group {max(held)}"
        return None

    def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler: Any = None) -> None:
        """Copy the held state back, bitwise; a model or optimizer it no longer fits is refused in
        one line (SnapshotMismatch), before anything is changed."""
        why = self.mismatch(model, optimizer)
        if why:
            raise SnapshotMismatch(f"guard: the snapshot of step {self.step} no longer fits: {why}; "
                                   "nothing was restored")
        live = state_tensors(model, optimizer)
        names = list(self.buffers)
        missing = [n for n in names if n not in live]  # optimizer state that was reset since: made again
        for name in missing:
            _, g, i, key = name.split(".", 3)
            p = optimizer.param_groups[int(g)]["params"][int(i)]
            held = self.buffers[name]
            optimizer.state[p][key] = torch.empty(held.shape, dtype=held.dtype, device=_home(p, key, held))
            live[name] = optimizer.state[p][key]
        copy([live[n] for n in names], [self.buffers[n] for n in names])
        for name in set(live) - set(self.shapes):  # optimizer state that appeared after the snapshot
            _, g, i, key = name.split(".", 3)
            p = optimizer.param_groups[int(g)]["params"][int(i)]
            optimizer.state[p].pop(key, None)
            if not optimizer.state[p]:
                del optimizer.state[p]
        for name, value in self.values.items():
            _, g, i, key = name.split(".", 3)
            optimizer.state[optimizer.param_groups[int(g)]["params"][int(i)]][key] = value
        if scaler is not None and self.scaler is not None:
            copy([scaler._scale, scaler._growth_tracker], self.scaler)


@torch.no_grad()
def copy(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """dst[i] <- src[i], queued without waiting where a side is on a GPU (pinned host memory)."""
    if dst:
        torch._foreach_copy_(dst, src, non_blocking=True)


def _home(p: torch.Tensor, key: str, held: torch.Tensor) -> torch.device:
    """Where an optimizer entry lives: Adam's step count on the CPU unless fused or capturable."""
    return torch.device("cpu") if key == "step" and held.dim() == 0 and not p.is_cuda else p.device


def _scaler_copy(scaler: Any, old: list[torch.Tensor] | None) -> list[torch.Tensor] | None:
    """A GradScaler's scale and growth tracker copied to the host without reading them (its
    state_dict() would read the scale: a device sync); None before its first scale()."""
    live = [getattr(scaler, "_scale", None), getattr(scaler, "_growth_tracker", None)]
    if scaler is None or not all(isinstance(t, torch.Tensor) for t in live):
        return None
    bufs = old if old is not None and all(b.shape == t.shape and b.dtype == t.dtype for b, t in zip(old, live)) \
        else [torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda) for t in live]
    copy(bufs, live)
    return bufs


def _difference(held: dict[str, Any], live: dict[str, Any], what: str) -> str:
    gone = sorted(set(held) - set(live))
    new = sorted(set(live) - set(held))
    if gone or new:
        parts = ([f"{gone[0].split('.', 1)[1]} is gone"] if gone else []) + \
                ([f"{new[0].split('.', 1)[1]} is new"] if new else [])
        more = len(gone) + len(new) - len(parts)
        return f"{what} changed: " + ", ".join(parts) + (f" (and {more} more)" if more > 0 else "")
    name = next(n for n in held if held[n] != live[n])
    return f"{what}'s {name.split('.', 1)[1]} was {_said(held[name])}, is now {_said(live[name])}"


def _said(shape: Any) -> str:
    return f"{list(shape[0])} {str(shape[1]).removeprefix('torch.')}" if isinstance(shape, tuple) else shape
