"""The Monitor's pure parts: what it writes in run.json, how it checks a model and its tokens, the
gradient norm of a step, a record's divergence, and the internal signals at an eval step (a logged
number is checked in `train.values`, below the Monitor and the guard alike)."""

from __future__ import annotations

import math
from contextlib import nullcontext
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

import torch

from train.host_copy import HostCopy
from train.monitor.optimizer_kinds import optimizer_kinds
from train.values import short

__all__ = ["EvalReadings", "activation_windows", "autocast_factory", "check_eval_tokens", "check_model", "check_tokens",
           "describe_model", "divergence_reason", "grad_norm", "grad_squares", "group_lrs", "hyperparameters",
           "internal_stats", "monitored_run_json", "norm_from_squares", "param_groups_json", "placed_internals",
           "resume_mismatch", "update_readings"]


def autocast_factory(autocast: Any) -> Any:
    """`autocast` as a factory of context managers: a factory (nullcontext, a function) as given;
    a context manager itself (nanoGPT's `ctx = torch.amp.autocast(...)`) handed back each time."""
    if not isinstance(autocast, type) and hasattr(autocast, "__enter__") and hasattr(autocast, "__exit__"):
        return lambda: autocast
    if not callable(autocast):
        raise TypeError(f"Monitor: autocast must be a context manager or a function making one, got {short(autocast)}")
    return autocast


def check_model(model: Any, optimizer: torch.optim.Optimizer) -> None:
    """Refuse, in one line, a model the Monitor cannot watch: not a module, no parameters, weights
    not materialised (the meta device), or none of them updated by the optimizer."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"Monitor: model must be a torch.nn.Module, got {type(model).__name__} {short(model)}")
    params = list(model.parameters())
    if not params:
        raise ValueError(f"Monitor: the {type(model).__name__} has no parameters: give the model being trained")
    if any(p.is_meta for p in params):
        raise ValueError(f"Monitor: the {type(model).__name__} has parameters on the meta device (not materialised): "
                         "call model.to_empty(device=...) and initialise or load its weights first")
    mine = {id(p) for p in params}
    if not any(id(p) in mine for group in optimizer.param_groups for p in group["params"]):
        raise ValueError(f"Monitor: the optimizer updates none of the {type(model).__name__}'s parameters "
                         "(was it made for another model?)")


def check_tokens(tokens: Any) -> torch.Tensor:
    """eval_tokens as a long tensor [batch pos]: any integer dtype, at least one token."""
    if not isinstance(tokens, torch.Tensor):
        hint = ": pass torch.from_numpy(...)" if type(tokens).__module__ == "numpy" else ""
        raise ValueError(f"Monitor: eval_tokens must be a torch tensor of token ids [batch pos], "
                         f"got {type(tokens).__name__}{hint}")
    if tokens.dtype == torch.bool or tokens.dtype.is_floating_point or tokens.dtype.is_complex:
        raise ValueError(f"Monitor: eval_tokens must hold integer token ids [batch pos], got {tokens.dtype}")
    if tokens.dim() != 2 or tokens.numel() == 0 or tokens.is_meta:
        what = "on the meta device" if tokens.is_meta else f"of shape {list(tokens.shape)}"
        raise ValueError(f"Monitor: eval_tokens must be token ids [batch pos] with at least one token, got a tensor {what}")
    return tokens.long()


def check_eval_tokens(tokens: Any, config: Any) -> torch.Tensor | None:
    """eval_tokens checked (`check_tokens`) and, for a model the store rebuilds as ours (`config`),
    against its context and vocabulary; None stays None (no internals measured)."""
    if tokens is None:
        return None
    tokens = check_tokens(tokens)
    if config is not None:
        window = config.family == "mlp"  # the MLP family slides its n_ctx window along
        if tokens.shape[1] < config.n_ctx if window else tokens.shape[1] > config.n_ctx:
            raise ValueError(f"Monitor: eval_tokens has {tokens.shape[1]} positions, "
                             f"{'fewer' if window else 'more'} than the model's context of {config.n_ctx}")
        low, high = (int(v) for v in tokens.aminmax())
        if low < 0 or high >= config.d_vocab:
            raise ValueError(f"Monitor: eval_tokens holds ids outside [0, {config.d_vocab}) (min {low}, max {high})")
    return tokens


def resume_mismatch(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """Why run.json's model (`old`) is not the model now monitored (`new`), or None: their layers,
    heads, width, vocabulary, class or size differ (the new records would not fit the old shape)."""
    def said(run: dict[str, Any]) -> dict[str, Any]:
        model = run.get("model") if isinstance(run.get("model"), dict) else {}
        watched = run.get("monitored_model") if isinstance(run.get("monitored_model"), dict) else {}
        return {**{k: model.get(k) for k in ("family", "n_layers", "n_heads", "d_model", "d_vocab")},
                **{k: watched.get(k) for k in ("class", "parameters")}}
    before, now = said(old), said(new)
    differ = [k for k in before if before[k] is not None and now[k] is not None and before[k] != now[k]]
    if not differ:
        return None
    text = lambda d: ", ".join(f"{k} {d[k]}" for k in differ)  # noqa: E731
    return f"run.json's model has {text(before)}; the live one has {text(now)}"


def grad_norm(model: torch.nn.Module) -> float | None:
    """The 2-norm of every gradient together, as the optimizer sees it (after any clipping)."""
    squares = grad_squares(model)
    return None if squares is None else norm_from_squares([float(s) for s in squares])


def grad_squares(model: torch.nn.Module) -> list[torch.Tensor] | None:
    """`grad_norm` still on the device: per (device, dtype) of the gradients, the sum of their
    squared norms (float64, fused), or None without gradients; `norm_from_squares` ends it."""
    grads = [p.grad.detach() for p in model.parameters() if p.grad is not None]
    if not grads:
        return None
    by_kind: dict[tuple, list[torch.Tensor]] = {}
    for g in grads:
        by_kind.setdefault((g.device, g.dtype), []).append(g.float() if g.dtype in (torch.float16, torch.bfloat16) else g)
    return [torch.stack(torch._foreach_norm(group)).double().square().sum() for group in by_kind.values()]


def norm_from_squares(squares: list[float]) -> float:
    return math.sqrt(sum(squares))


def update_readings(model: torch.nn.Module, before: dict[str, torch.Tensor], squares: list[torch.Tensor] | None,
                    lrs: Any) -> HostCopy:
    """A step's grad norm (`grad_squares`, taken before the step) and g/w/u table
    (`probes.updates.GwuReadings` of the update just made from `before`), measured on the device
    and sent to the host in one transfer, started here: `.get()` is {"grad_norm", "gwu"}."""
    from probes.updates import GwuReadings
    gwu = GwuReadings(model, before, lrs)

    def finish(values: dict[str, Any]) -> dict[str, Any]:
        squares = values["grad"]
        return {"grad_norm": None if squares is None else norm_from_squares(squares), "gwu": gwu.table(values["gwu"])}

    return HostCopy({"grad": squares, "gwu": gwu.norms}, finish)


def divergence_reason(record: dict[str, Any]) -> str | None:
    """Why a record shows a diverged run (a non-finite train loss or attention entropy), or None;
    None for a step the guard rewound (the run went on from an earlier state)."""
    from probes.doctor.rescues import rewound
    if rewound(record):
        return None
    loss = record.get("train_loss")
    if isinstance(loss, float) and not math.isfinite(loss):
        return f"the train loss is {loss}"
    for layer, heads in (record.get("attn_entropy") or {}).items():
        if any(h is None or not math.isfinite(h) for h in heads):
            return f"an attention entropy of layer {layer} is not finite"
    return None


def activation_windows(config: Any, tokens: torch.Tensor) -> list[torch.Tensor]:
    """The eval tokens [batch pos] in the windows `probes.activations.run` reads (its batches of
    `BATCH_SIZE`), cut once: cutting checks the ids on the host."""
    from probes.activations import BATCH_SIZE
    from probes.common import lm_windows
    return lm_windows(SimpleNamespace(cfg=config), tokens, BATCH_SIZE, targets=False)  # it reads only .cfg


@torch.no_grad()
def internal_stats(twin: torch.nn.Module, tokens: torch.Tensor, windows: list[torch.Tensor],
                   autocast: Any = nullcontext) -> HostCopy:
    """The doctor's internal signals on `tokens` [batch pos], measured on our hooked `twin` in eval
    mode (`train.data.forward_readings`; `probes.activations` on `windows`, `activation_windows`
    of the tokens): activations (dead and saturated units), attn_entropy, attn_logit_max,
    resid_rms, logit_max. All of it stays on the device and comes over in one transfer, started
    here: `.get()` is the record's internals. `autocast`: a context manager factory (the trainer's
    bf16 autocast)."""
    from probes import activations
    from train.data import DOCTOR_METRICS, finish_forward_stats, forward_readings  # by its full name: `train` may be a user's train.py now

    was_training = twin.training
    twin.eval()
    try:
        with autocast():
            stats = activations.layer_stats(twin, windows, grads=False, samples=False)
            forward = forward_readings(twin, tokens, doctor=DOCTOR_METRICS)
    finally:
        twin.train(was_training)

    def finish(values: dict[str, Any]) -> dict[str, Any]:
        values["activations"] = {name: activations.compact_row(stats[name].summarize(host))
                                 for name, host in values["activations"].items()}
        return finish_forward_stats(values)

    return HostCopy({"activations": {name: s.readings() for name, s in stats.items()}, **forward}, finish)


class EvalReadings:
    """What the Monitor measures at each eval step on its eval tokens [batch pos], set up once: the
    tokens (and, for our hooked twin, their activation windows, cut here where the ids were just
    checked on the host) moved to the model's device once, and the twin kept while it shares the
    model's weights (`models.store.live.hooked_twin`). `plan`: the tap's, for a model the store
    cannot rebuild (`train.monitor.tap`)."""

    def __init__(self, model: torch.nn.Module, config: Any, tokens: torch.Tensor, plan: Any, autocast: Any):
        self.model, self.config, self.plan, self.autocast = model, config, plan, autocast
        self.tokens = tokens
        self.windows = activation_windows(config, tokens) if config is not None else None
        self._on: tuple | None = None  # (device, tokens, windows) there
        self._twin: torch.nn.Module | None = None
        if plan is None:
            # built now, not at the first eval step: building it imports TransformerLens (and
            # transformers with it), seconds that would otherwise stall the user's loop mid-run
            from models.store.live import hooked_twin
            self._twin = hooked_twin(model, config)

    def measure(self) -> HostCopy:
        """One eval step's internals, measured on the device: `.get()` is the record's part."""
        if self.plan is not None:
            from train.monitor.tap import measure
            return measure(self.plan, self._inputs(next(self.model.parameters()).device)[0], self.autocast)
        from models.store.live import hooked_twin
        self._twin = hooked_twin(self.model, self.config, cached=self._twin)
        return internal_stats(self._twin, *self._inputs(next(self._twin.parameters()).device), self.autocast)

    @torch.no_grad()
    def attention(self) -> dict[str, list[float]]:
        """Each head's attention entropy on the eval tokens, read now on the host ({layer: [head]};
        empty for a model without attention): the guard's collapse readings. The tap's forward
        alone, not its activation statistics, for a model the store cannot rebuild."""
        if self.plan is not None:
            from train.monitor.tap import forward
            readings = forward(self.plan, self._inputs(next(self.model.parameters()).device)[0], self.autocast)
            return {layer: [round(h, 6) for h in entropy.tolist()] for layer, entropy in readings.entropy.items()}
        from models.store.live import hooked_twin
        from train.data import attention_entropy  # by its full name: `train` may be a user's train.py now
        self._twin = hooked_twin(self.model, self.config, cached=self._twin)
        return attention_entropy(self._twin, self._inputs(next(self._twin.parameters()).device)[0], self.autocast)

    def _inputs(self, device: torch.device) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        if self._on is None or self._on[0] != device:
            windows = None if self.windows is None else [w.to(device) for w in self.windows]
            self._on = (device, self.tokens.to(device), windows)
        return self._on[1], self._on[2]


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
    weights fall in (`probes.update_parts.report.parameter_group`), in the optimizer's order."""
    from probes.update_parts.report import parameter_group
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
    has none (nanochat's MuonAdamW); with several groups, each group's under `param_groups`; which
    kind of optimizer updates each parameter where they differ, or Muon's (`train.monitor.optimizer_kinds`)."""
    hyper = hyperparameters(optimizer.defaults or optimizer.param_groups[0])
    several = len(optimizer.param_groups) > 1
    return {"preset": None, "source": "monitor", "trainer": trainer, "model": model_json,
            "monitored_model": describe_model(model, kind),
            "train": {**schedule, "optimizer": type(optimizer).__name__.lower(), **hyper,
                      **({"param_groups": param_groups_json(model, optimizer)}
                         if several or not optimizer.defaults else {})},
            **optimizer_kinds(model, optimizer),
            "eval_tokens": None if eval_tokens is None else list(eval_tokens.shape),
            "torch": torch.__version__,
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def placed_internals(record: dict[str, Any], pending: tuple[list[str], Any] | None) -> dict[str, Any]:
    """`record` with its eval step's internals (`pending`: the keys made before they were measured,
    and their HostCopy) read, one wait for their transfer, and placed where they were measured:
    after the step and tokens, before the values given (given values win)."""
    if pending is None:
        return record
    head, internals = pending
    internals = internals.get() if internals is not None else {}
    first = {k: record[k] for k in head if k in record}
    return {**first, **internals, **{k: v for k, v in record.items() if k not in first}}
