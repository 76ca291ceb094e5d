"""The Monitor's pure parts: what it writes in run.json, how it checks a logged number, the
gradient norm of a step, a record's divergence, and the internal signals at an eval step."""

from __future__ import annotations

import math
import numbers
from contextlib import nullcontext
from datetime import datetime, timezone
from typing import Any

import torch

__all__ = ["describe_model", "divergence_reason", "first_optimizer", "grad_norm", "group_lrs", "hyperparameters",
           "internal_stats", "monitored_run_json", "number", "param_groups_json"]


def first_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer itself: accelerate's AcceleratedOptimizer and Lightning's wrappers hold
    it as `.optimizer`, and only the inner one runs its step hooks."""
    seen = optimizer
    while not isinstance(seen, torch.optim.Optimizer) or isinstance(getattr(seen, "optimizer", None),
                                                                     torch.optim.Optimizer):
        inner = getattr(seen, "optimizer", None)
        if inner is None:
            raise ValueError(f"Monitor: expected a torch optimizer, got {type(optimizer).__name__}")
        seen = inner
    return seen


def number(name: str, value: Any) -> float | int | None:
    """A logged value as a plain number: a 0-d tensor is read (one device sync), a numpy scalar
    becomes a Python one, None stays None."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"Monitor.log: {name} must be one number, got a tensor of shape {list(value.shape)}")
        value = value.item()
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return value
    if isinstance(value, numbers.Real) and not isinstance(value, bool):  # numpy's float32, int64, ...
        return int(value) if isinstance(value, numbers.Integral) else float(value)
    raise ValueError(f"Monitor.log: {name} must be a number, got {type(value).__name__} {value!r}")


def grad_norm(model: torch.nn.Module) -> float | None:
    """The 2-norm of every gradient together, as the optimizer sees it (after any clipping)."""
    grads = [p.grad.detach() for p in model.parameters() if p.grad is not None]
    if not grads:
        return None
    by_kind: dict[tuple, list[torch.Tensor]] = {}
    for g in grads:
        by_kind.setdefault((g.device, g.dtype), []).append(g.float() if g.dtype in (torch.float16, torch.bfloat16) else g)
    squares = [torch.stack(torch._foreach_norm(group)).double().square().sum().item() for group in by_kind.values()]
    return math.sqrt(sum(squares))


def divergence_reason(record: dict[str, Any]) -> str | None:
    """Why a record shows a diverged run (a non-finite train loss or attention entropy), or None."""
    loss = record.get("train_loss")
    if isinstance(loss, float) and not math.isfinite(loss):
        return f"the train loss is {loss}"
    for layer, heads in (record.get("attn_entropy") or {}).items():
        if any(h is None or not math.isfinite(h) for h in heads):
            return f"an attention entropy of layer {layer} is not finite"
    return None


@torch.no_grad()
def internal_stats(twin: torch.nn.Module, tokens: torch.Tensor, autocast: Any = nullcontext) -> dict[str, Any]:
    """The doctor's internal signals on `tokens` [batch pos], measured on our hooked `twin` in eval
    mode (`train.data.forward_stats`, `probes.activations`): activations (dead and saturated
    units), attn_entropy, attn_logit_max, resid_rms, logit_max. `autocast`: a context manager
    factory (the trainer's bf16 autocast)."""
    from probes import activations
    from train import data

    was_training = twin.training
    twin.eval()
    try:
        tokens = tokens.to(next(twin.parameters()).device)
        with autocast():
            health = activations.run(twin, tokens, grads=False).compact()
            stats = data.forward_stats(twin, tokens, doctor=data.DOCTOR_METRICS)
    finally:
        twin.train(was_training)
    return {"activations": health, **stats}


def describe_model(model: torch.nn.Module, kind: str) -> dict[str, Any]:
    """What the Monitor knows of the model: its kind (`models.store.live.model_kind`), class, size."""
    params = sum(p.numel() for p in model.parameters())
    return {"kind": kind, "class": type(model).__name__, "parameters": params}


def group_lrs(optimizer: torch.optim.Optimizer) -> list[float | None] | None:
    """Each param group's learning rate, when they differ (nanochat's MuonAdamW has one per kind of
    weight); None when all are the same (the record's `lr`, group 0's, says it)."""
    lrs = [group.get("lr") for group in optimizer.param_groups]
    return lrs if len(set(lrs)) > 1 else None


def hyperparameters(settings: dict[str, Any]) -> dict[str, Any]:
    """The plain-valued settings of an optimizer or of one of its param groups."""
    return {k: v for k, v in settings.items() if k != "params" and (isinstance(v, (int, float, str, bool, type(None)))
            or (isinstance(v, tuple) and all(isinstance(x, (int, float)) for x in v)))}


def param_groups_json(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Each param group's hyperparameters, its parameter count and the doctor's groups its
    weights fall in (`probes.update_report.parameter_group`), in the optimizer's order."""
    from probes.update_report import parameter_group
    from probes.updates import strip_wrapper_prefix

    names = {id(p): strip_wrapper_prefix(n) for n, p in model.named_parameters()}
    out = []
    for group in optimizer.param_groups:
        params = list(group["params"])
        kinds = sorted({parameter_group(names[id(p)]) for p in params if id(p) in names})
        out.append({**hyperparameters(group), "parameters": sum(p.numel() for p in params), "groups": kinds})
    return out


def monitored_run_json(model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, kind: str, trainer: str,
                       model_json: dict[str, Any] | None, schedule: dict[str, Any],
                       eval_tokens: torch.Tensor | None) -> dict[str, Any]:
    """run.json of a monitored loop: `model_json` (our config where we have one, else what a tapped
    forward saw: the doctor's entropy rules read n_ctx), the monitor's `schedule` (steps, log_every,
    eval_every), the optimizer and its hyperparameters: its defaults, or param group 0's where it
    has none (nanochat's MuonAdamW); with several groups, each group's under `param_groups`."""
    hyper = hyperparameters(optimizer.defaults or optimizer.param_groups[0])
    several = len(optimizer.param_groups) > 1
    return {"preset": None, "source": "monitor", "trainer": trainer, "model": model_json,
            "monitored_model": describe_model(model, kind),
            "train": {**schedule, "optimizer": type(optimizer).__name__.lower(), **hyper,
                      **({"param_groups": param_groups_json(model, optimizer)}
                         if several or not optimizer.defaults else {})},
            "eval_tokens": None if eval_tokens is None else list(eval_tokens.shape),
            "torch": torch.__version__,
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}
