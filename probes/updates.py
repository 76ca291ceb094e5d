"""g / w / u per named parameter: gradient size, weight size and relative update size.

    from probes import updates
    updates.from_run("checkpoints/shakespeare_rms4", step=3000)   # what training logged
    updates.from_run("checkpoints/shakespeare_rms4")              # every logged step (history)
    updates.between("run/step_000100", "run/step_000101", tokens)   # from two snapshots
    updates.run(model, tokens, optimizer="adam", lr=1e-3)         # one step taken on a copy

The series' table (`W_pos  g=2.4e-04 w=9.9e-01 u=1.2e-05`) and makemore's update:data ratio:

    g = rms(grad)                          how big the gradient entries are
    w = rms(param)                         how big the weights are
    u = rms(param_after - param_before) / rms(param_after)
                                           the fraction of the weights one optimizer step moved
    u_nominal = lr * g / w                 the series' formula; equals u for plain SGD only

`u` is measured from the actual step, so it is right for SGD with momentum, Adam and AdamW
alike (Adam moves every entry by about lr whatever g is, so there u ~ lr / w, not lr * g / w).
makemore's healthy band is log10(u) around -3. When w == 0 `u` is None; a parameter without a
gradient has g = None. The pure functions below take tensors and modules: no hooks, no I/O.

    python -m probes.updates --ckpt checkpoints/shakespeare_rms4
    python -m probes.updates --ckpt checkpoints/shakespeare_rms4 --history
"""

from __future__ import annotations

if __name__ == "__main__":  # Ctrl-C/SIGTERM: one line from here on; --help and bad arguments
    from models.interrupts import quiet_signals  # answered before torch is imported (~4 s)
    quiet_signals()
    from probes.args import updates_parser
    updates_parser().parse_early()

import argparse
import copy
import logging
import math
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from torch import nn

from models.loss import lm_loss, lm_loss_terms
from probes.args import updates_parser as build_parser
from probes.cli import run_probe
from probes.common import ProbeInputError, lm_windows, model_device, token_batches
from probes.update_parts.report import GROUPS, TARGET_BAND, UpdateHistory, UpdateReport, layout_groups_of, parameter_group
from probes.update_parts.rows import lr_by_name, named_trainable, packed_name, snapshot_params, strip_wrapper_prefix

log = logging.getLogger(__name__)

__all__ = ["GROUPS", "TARGET_BAND", "UpdateHistory", "UpdateReport", "between", "format_gwu",
           "from_run", "gwu_from_snapshots", "gwu_table", "lr_by_name", "main", "parameter_group", "rms", "run",
           "snapshot_params", "strip_wrapper_prefix"]

Table = dict[str, dict[str, float | None]]


def rms(t: torch.Tensor) -> float:
    """Root mean square of all entries, accumulated in float64 (0.0 for an empty tensor)."""
    if t.numel() == 0:
        return 0.0
    return float(t.detach().double().pow(2).mean().sqrt())


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def rms_many(tensors: list[torch.Tensor]) -> list[float]:
    """rms of each tensor, computed with fused norms per (device, dtype) and one host sync each.

    float64 tensors stay float64 (exact to ~1e-15); float32 accumulates in float32 (~1e-6
    relative, plenty for a ratio shown to two digits); half precision is upcast to float32.
    """
    groups = norm_groups(tensors)
    return rms_from_norms([t.numel() for t in tensors], groups, [norms.tolist() for _, norms in groups])  # a sync per group


def norm_groups(tensors: list[torch.Tensor]) -> list[tuple[list[int], torch.Tensor]]:
    """Each non-empty tensor's 2-norm on its device, fused per (device, dtype): per group the
    tensors' indices and their norms [k] in float64 (nothing read on the host yet)."""
    groups: dict[tuple, list[int]] = {}
    for i, t in enumerate(tensors):
        if t.numel():
            groups.setdefault((t.device, t.dtype), []).append(i)
    out = []
    for (_, dtype), index in groups.items():
        group = [tensors[i].detach() for i in index]
        if dtype in (torch.float16, torch.bfloat16):
            group = [t.float() for t in group]
        out.append((index, torch.stack(torch._foreach_norm(group)).double()))  # [k]
    return out


def rms_from_norms(numels: list[int], groups: list[tuple[list[int], Any]], norms: list[list[float]]) -> list[float]:
    """rms = norm / sqrt(numel) of each tensor (`numels`: their sizes), from `norm_groups`' norms
    read on the host (0.0 for an empty tensor)."""
    out = [0.0] * len(numels)
    for (index, _), group_norms in zip(groups, norms):
        for i, norm in zip(index, group_norms):
            out[i] = norm / math.sqrt(numels[i])
    return out


class GwuReadings:
    """What `gwu_table` measures, still on the device: the 2-norms of each row's weights after the
    step, its update, its weights before and its gradient (`norms`: per kind, `norm_groups`).
    `table(host)` finishes the table from those norms read on the host (`host` mirrors `norms`),
    so a caller can bring them over with its other numbers in one transfer (the Monitor does)."""

    def __init__(self, model: nn.Module, before: Mapping[str, torch.Tensor], lr: float | Mapping[str, float]):
        params = {name: p for name, p in named_trainable(model).items() if name in before}
        grads = named_trainable(model, grads=True)
        self.names, self.lr = list(params), lr
        # a head's row is a strided view of its layer's packed q/k/v: contiguous copies reduce in
        # the same order as a snapshot's tensors do (`gwu_from_snapshots` agrees to the last bit)
        after = [params[n].detach().contiguous() for n in self.names]
        deltas = torch._foreach_sub(after, [before[n].to(a.device) for n, a in zip(self.names, after)])
        self.with_grad = [n for n in self.names if grads.get(n) is not None]
        gradients = [grads[n].contiguous() for n in self.with_grad]
        tensors = {"w": after, "d": deltas, "w0": [before[n] for n in self.names], "g": gradients}
        self.norms = {kind: norm_groups(ts) for kind, ts in tensors.items()}
        self._numels = {kind: [t.numel() for t in ts] for kind, ts in tensors.items()}  # not the tensors: memory

    def table(self, host: Mapping[str, list[tuple[list[int], list[float]]]]) -> Table:
        """{name: {"g", "w", "u", "u_nominal"}} in module order, from `norms` read on the host."""
        rms = {kind: rms_from_norms(numels, self.norms[kind], [norms for _, norms in host[kind]])
               for kind, numels in self._numels.items()}
        g = dict(zip(self.with_grad, rms["g"]))
        table: Table = {}
        lr = self.lr
        for name, w_i, d_i, w0_i in zip(self.names, rms["w"], rms["d"], rms["w0"]):
            g_i = g.get(name)
            lr_i = lr if not isinstance(lr, Mapping) else lr.get(name, lr.get(packed_name(name), 0.0))
            table[name] = {"g": g_i, "w": w_i, "u": _ratio_from(w0_i, d_i, w_i),
                           "u_nominal": None if g_i is None else _ratio_from(w0_i, lr_i * g_i, w_i)}
        return table


def gwu_table(model: nn.Module, before: Mapping[str, torch.Tensor], lr: float | Mapping[str, float]) -> Table:
    """g/w/u per parameter, after `optimizer.step()` and before `zero_grad()`.

    before: `snapshot_params(model)` taken just before the step. Parameters absent from
    `before` are skipped. `lr`: one rate, or each parameter's (`lr_by_name`: optimizers such as
    nanochat's MuonAdamW give each group its own) for u_nominal.
    Returns {name: {"g", "w", "u", "u_nominal"}} in module order.
    The update is subtracted in the parameters' own dtype: for nearby floats that difference
    is exact (Sterbenz), so tiny updates of big weights keep their digits. A parameter that was
    all zeros before the step (a bias at init) has no u: its new weight is the update itself, so
    the ratio would read 1 whatever the step size (`_ratio_from`).
    """
    readings = GwuReadings(model, before, lr)
    return readings.table({kind: [(index, norms.tolist()) for index, norms in groups]  # a sync per group
                           for kind, groups in readings.norms.items()})


def _ratio_from(w_before: float, num: float, w_after: float) -> float | None:
    """num / w_after, or None for a parameter that was all zeros before (nothing to compare to)."""
    return None if w_before == 0.0 else _ratio(num, w_after)


def _strip_state(state: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return {strip_wrapper_prefix(k): v for k, v in state.items()
            if isinstance(v, torch.Tensor) and v.is_floating_point()}


def gwu_from_snapshots(state_a: Mapping[str, Any], state_b: Mapping[str, Any]) -> Table:
    """w and u between two state dicts (a earlier, b later), e.g. two snapshots of one run.

    u = rms(b - a) / rms(b): over k optimizer steps this is the accumulated relative update,
    roughly k times the per-step u when updates keep their direction. g cannot be recovered
    offline (snapshots hold no gradients), so only "w" and "u" are returned. Tensors present in
    both with the same shape are compared; buffers that are not parameters are included as well.
    """
    a, b = _strip_state(state_a), _strip_state(state_b)
    names = [n for n, t in b.items() if n in a and a[n].shape == t.shape and a[n].dtype == t.dtype]
    after = [b[n] for n in names]
    w, w0 = rms_many(after), rms_many([a[n] for n in names])
    d = rms_many(torch._foreach_sub(after, [a[n].to(b[n].device) for n in names]))  # as gwu_table does
    return {name: {"w": w_i, "u": _ratio_from(w0_i, d_i, w_i)} for name, w_i, d_i, w0_i in zip(names, w, d, w0)}


def format_gwu(table: Table, band: tuple[float, float] = TARGET_BAND, name_width: int = 36) -> str:
    """The series' aligned table of a raw g/w/u table, one row per parameter (no group summary)."""
    return "\n".join(UpdateReport.from_table(table, band=band).table_lines(name_width))


# --------------------------------------------------------------------------- sources


def _gwu_records(run_dir: Path) -> list[dict[str, Any]]:
    from models.checkpoint import is_run_dir, read_metrics

    if not is_run_dir(run_dir):
        raise ProbeInputError(f"{run_dir} is not a run directory (no step_NNNNNN snapshots)")
    records = read_metrics(run_dir)
    if not records:
        raise ProbeInputError(f"{run_dir} has no metrics.jsonl records to read g/w/u from")
    logged = [r for r in records if isinstance(r.get("gwu"), dict) and r["gwu"]]
    if not logged:
        raise ProbeInputError(f"{run_dir}: training logged no g/w/u (records at {len(records)} steps, "
                              "none with a 'gwu' table)")
    return logged


def from_run(run_dir: str | Path, step: int | None = None, *,
             band: tuple[float, float] = TARGET_BAND) -> UpdateReport | UpdateHistory:
    """What training logged: the report at `step`, or (step None) the history of every logged step."""
    from models.store.run import read_run_json

    records = _gwu_records(Path(run_dir))
    try:
        groups = layout_groups_of(read_run_json(Path(run_dir)))  # the layout the Monitor found, if any
    except ValueError:  # an unreadable run.json: the names alone group (its own reader says why)
        groups = {}
    history = UpdateHistory([UpdateReport.from_table(r["gwu"], band=band, step=int(r["step"]), source="run",
                                                     lr=r.get("lr"), layout_groups=groups)
                             for r in records])
    return history if step is None else history.at(step)


def _load(snapshot: Any) -> Any:
    from models.checkpoint import load_checkpoint

    return snapshot if hasattr(snapshot, "model") else load_checkpoint(snapshot)


def _logged_lr(run_dir: Path, step: int | None) -> float | None:
    """The lr training logged for the update that produced `step` (None if not logged)."""
    from models.checkpoint import read_metrics

    if step is None or not (run_dir / "metrics.jsonl").is_file():
        return None
    return next((r.get("lr") for r in read_metrics(run_dir) if r.get("step") == step), None)


def between(snapshot_a: Any, snapshot_b: Any, tokens: torch.Tensor | None = None, *,
            band: tuple[float, float] = TARGET_BAND) -> UpdateReport:
    """u from the difference of two snapshots of one run (paths or loaded Snapshots).

    Over k optimizer steps u = rms(b - a) / rms(b) is the accumulated relative update; with
    k = 1 it equals what training logged for that step. With `tokens` [batch pos], g comes from
    a fresh backward pass on snapshot a (the weights the update started from), and u_nominal
    uses the lr logged for that step when the snapshots are one step apart.
    """
    a, b = _load(snapshot_a), _load(snapshot_b)
    if a.config != b.config:
        raise ProbeInputError(f"{a.name} and {b.name} are snapshots of different models "
                              "(their configs differ); compare two snapshots of one run")
    if a.step is not None and b.step is not None and a.step > b.step:
        a, b = b, a
    if a.path.resolve() == b.path.resolve():
        raise ProbeInputError(f"both snapshots are {a.name}: give two different steps")
    table = gwu_from_snapshots(a.model.state_dict(), b.model.state_dict())
    lr = None
    if tokens is not None:
        grads = _gradients(a.model, tokens)
        one_step = a.step is not None and b.step == a.step + 1
        lr = _logged_lr(b.path.parent, b.step) if one_step else None
        for name, row in table.items():
            g = rms(grads[name]) if name in grads else None
            row["g"] = g
            row["u_nominal"] = lr * g / row["w"] if None not in (lr, g) and row["w"] else None
    span = b.step - a.step if a.step is not None and b.step is not None else None
    return UpdateReport.from_table(table, band=band, step=b.step, source="between", lr=lr, span=span)


def _gradients(model: nn.Module, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """Gradients of the mean next-token cross-entropy on a copy (the model is left untouched)."""
    work = _fresh_copy(model)
    mean_loss(work, tokens).backward()
    return {name: g for name, g in named_trainable(work, grads=True).items() if g is not None}


def _fresh_copy(model: nn.Module) -> nn.Module:
    work = copy.deepcopy(model)
    work.zero_grad(set_to_none=True)
    work.train(model.training)
    return work


def mean_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over every predicted position of `tokens` [batch pos].

    Rows longer than a training window are cut into windows (`probes.common.lm_windows`).
    """
    device = model_device(model)
    batches = lm_windows(model, tokens, batch_size=64)
    losses = [(lm_loss(model, b.to(device)), lm_loss_terms(model, b)) for b in batches]
    total = sum(n for _, n in losses)
    return sum(loss * (n / total) for loss, n in losses)


OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}


def run(model: nn.Module, tokens: torch.Tensor | list[torch.Tensor], optimizer: str | Callable[..., Any] = "sgd", *,
        lr: float = 1e-3, band: tuple[float, float] = TARGET_BAND, **kwargs: Any) -> UpdateReport:
    """One optimizer step taken on a copy of `model`: the caller's model and gradients stay as they are.

    g is the gradient of the mean next-token cross-entropy over every position of `tokens`
    [batch pos] (or a list of such batches); `optimizer` is "sgd" | "adam" | "adamw" or a callable(params, lr=lr, **kwargs)
    returning a torch optimizer (fresh: Adam's first step moves every entry by about lr).
    """
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ProbeInputError(f"lr must be a positive finite number, got {lr!r}")
    make = OPTIMIZERS.get(optimizer) if isinstance(optimizer, str) else optimizer
    if make is None:
        raise ProbeInputError(f"unknown optimizer {optimizer!r}; use sgd, adam, adamw or a callable")
    work = _fresh_copy(model)
    mean_loss(work, tokens).backward()
    opt = make([p for p in work.parameters() if p.requires_grad], lr=lr, **kwargs)
    before = snapshot_params(work)
    opt.step()
    return UpdateReport.from_table(gwu_table(work, before, lr), band=band, source="step", lr=lr)


# --------------------------------------------------------------------------- CLI


def _snapshot_arg(run_dir: Path, text: str) -> Path:
    """A step number of the run (its step_NNNNNN, or the numbered checkpoint file of a folder of
    nanoGPT checkpoints), or a path."""
    from models.checkpoint import is_run_dir, list_snapshots, snapshot_name, snapshot_step

    if not text.isdigit():
        return Path(text)
    found = [p for p in list_snapshots(run_dir) if snapshot_step(p) == int(text)] if is_run_dir(run_dir) else []
    return found[0] if found else run_dir / snapshot_name(int(text))


def _input_batches(args: argparse.Namespace, snap: Any) -> tuple[list[torch.Tensor], str]:
    """Every [batch pos] batch of the input (all of them go into the one step's gradient, as the
    description says), and where they came from."""
    return token_batches(args, snap.tokenizer, snap.config.n_ctx + 1, snap)


def _report(args: argparse.Namespace) -> UpdateReport | UpdateHistory:
    from models.checkpoint import is_run_dir, load_from_args

    ckpt, band = Path(args.ckpt), tuple(args.band)
    has_input = any(x is not None for x in (args.text, args.text_file, args.data))
    if args.between:
        a, b = (_load(_snapshot_arg(ckpt, x)) for x in args.between)
        return between(a, b, _input_batches(args, a)[0] if has_input else None, band=band)
    if has_input or not is_run_dir(ckpt):  # not a run and no input: a step on its own text
        snap = load_from_args(args)
        tokens, source = _input_batches(args, snap)
        report = run(snap.model, tokens, args.optimizer, lr=args.lr, band=band)
        report.text = source
        return report
    history = from_run(ckpt, band=band)
    return history if args.history else history.at(args.step) if args.step is not None else history.latest


def main(argv: list[str] | None = None) -> int:
    return run_probe(build_parser, argv, _report)


if __name__ == "__main__":
    from models.cli import exit_entry
    exit_entry(main())
