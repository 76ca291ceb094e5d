"""Activation health per MLP hidden layer: makemore's diagnostics for a trained or training net.

    from probes import activations
    result = activations.run(model, tokens)          # [batch pos] ids; ours or a TransformerBridge
    result.layers[0]["dead_fraction"]                # units never active over the whole batch

Per hidden layer (`blocks.{l}.mlp.hook_post`, `hook_post_{i}` for deeper MLPs, `mlp.hook_post`
in the MLP family):

- dead_fraction: units that are never active over every position of the batch. Active means
  pre-activation > 0 for ReLU and GELU (a unit whose input is never positive passes no
  gradient worth having), |tanh| <= `saturation` for tanh (a unit pinned at +-1 is dead too);
- saturated_fraction: activations in the flat part of the non-linearity: |tanh| > 0.97
  (makemore's threshold), GELU input below -3 (|slope| < 0.012), SiLU input below -6 (the same
  slope), ReLU output exactly 0;

A gated MLP (Llama's SwiGLU: act(x W_gate) * (x W_in)) is read the same way: `hook_pre` is the
gate's input to the non-linearity, `hook_post` the product that W_out reads.
- mean / std of the activations, and (with `grads=True`) of the gradient of the mean
  next-token cross-entropy with respect to them, each with a histogram.

    python -m probes.activations --ckpt checkpoints/shakespeare_rms4 --data data/tinyshakespeare.txt
"""

from __future__ import annotations

if __name__ == "__main__":  # Ctrl-C/SIGTERM: one line from here on; --help and bad arguments
    from models.interrupts import quiet_signals  # answered before torch is imported (~4 s)
    quiet_signals()
    from probes.args import activations_parser
    activations_parser().parse_early()

import re
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch

from models.loss import lm_loss
from probes.args import activations_parser as build_parser
from probes.cli import Shown, run_probe
from probes.common import ProbeInputError, lm_windows, model_device, require_cfg, token_batches, tokens_or_text
from probes.thresholds import SATURATION

GELU_FLAT = -3.0  # |GELU'(x)| < 0.012 below this input
SILU_FLAT = -6.0  # |SiLU'(x)| < 0.0123 below: sigmoid(x) (1 + x (1 - sigmoid(x))) at -6
HIST_BINS = 40
SAMPLE_CAP = 200_000  # values kept per layer for the histograms
BATCH_SIZE = 16  # windows per forward
POST_HOOK = re.compile(r"(^|\.)mlp\.hook_post(_\d+)?$")


# --------------------------------------------------------------------------- pure functions


def active_mask(pre: torch.Tensor, post: torch.Tensor, act_fn: str,
                saturation: float = SATURATION) -> torch.Tensor:
    """Where a unit is active (passes gradient): pre > 0 (relu, gelu) or |post| <= saturation (tanh)."""
    if act_fn == "tanh":
        return post.abs() <= saturation
    return pre > 0


def saturated_mask(pre: torch.Tensor, post: torch.Tensor, act_fn: str,
                   saturation: float = SATURATION) -> torch.Tensor:
    """Activations in the flat part of the non-linearity (zero or vanishing slope)."""
    if act_fn == "tanh":
        return post.abs() > saturation
    if act_fn == "gelu":
        return pre < GELU_FLAT
    if act_fn == "silu":
        return pre < SILU_FLAT
    return post == 0


def histogram(values: torch.Tensor, bins: int = HIST_BINS) -> dict[str, list[float]]:
    """Counts over `bins` equal bins spanning the values' range: {"edges": [bins+1], "counts": [bins]}."""
    values = values.detach().float().flatten()
    values = values[torch.isfinite(values)]
    if values.numel() == 0:
        return {"edges": [], "counts": []}
    lo, hi = float(values.min()), float(values.max())
    if hi <= lo:
        hi = lo + 1e-12
    counts = torch.histc(values, bins=bins, min=lo, max=hi)
    edges = torch.linspace(lo, hi, bins + 1)
    return {"edges": edges.tolist(), "counts": counts.long().tolist()}


@dataclass
class Moments:
    """Count, sum and sum of squares in float64 (tensors on the values' device, read only when
    summarised: no host sync per batch), plus a capped sample for a histogram (`keep`)."""

    n: int = 0
    total: torch.Tensor | float = 0.0
    total_sq: torch.Tensor | float = 0.0
    sample: list[torch.Tensor] = field(default_factory=list)
    keep: bool = True

    def add(self, values: torch.Tensor) -> None:
        v = values.detach().double()
        self.n += v.numel()
        self.total = self.total + v.sum()  # float64 adds, as Python's floats would make them
        self.total_sq = self.total_sq + v.pow(2).sum()
        if self.keep:
            _keep_sample(self.sample, values)


def mean_std(n: int, total: float, total_sq: float) -> tuple[float, float]:
    mean = total / n
    return mean, max(total_sq / n - mean ** 2, 0.0) ** 0.5


@dataclass
class LayerStats:
    """Running sums over batches for one hidden layer (memory: one [d_hidden] mask + samples),
    kept on the activations' device. `readings()` are its numbers still there; `summarize` ends
    them on the host; `summary()` does both (one host sync), with the histograms."""

    act_fn: str
    saturation: float
    ever_active: torch.Tensor | None = None  # [d_hidden] bool
    saturated: torch.Tensor | int = 0  # int64 count
    nonfinite: torch.Tensor | int = 0  # NaN/inf activations: a diverged layer, whose units are not "dead"
    values: Moments = field(default_factory=Moments)
    grad: Moments = field(default_factory=Moments)  # the loss gradient at the activations
    samples: bool = True  # keep samples for the histograms (a host copy per batch)

    def __post_init__(self):
        self.values.keep = self.grad.keep = self.samples

    def update(self, pre: torch.Tensor, post: torch.Tensor) -> None:  # [batch pos d_hidden] each
        active = active_mask(pre, post, self.act_fn, self.saturation).flatten(0, -2).any(0)
        self.ever_active = active if self.ever_active is None else self.ever_active | active
        self.saturated = self.saturated + saturated_mask(pre, post, self.act_fn, self.saturation).sum()
        self.nonfinite = self.nonfinite + (~torch.isfinite(post)).sum()
        self.values.add(post)

    def readings(self) -> dict[str, torch.Tensor]:
        """The numbers `summarize` needs, on the device (0-d each)."""
        out = {"dead": (~self.ever_active).float().mean(), "saturated": self.saturated,
               "nonfinite": self.nonfinite, "total": self.values.total, "total_sq": self.values.total_sq}
        if self.grad.n:
            out.update({"grad_total": self.grad.total, "grad_total_sq": self.grad.total_sq})
        return {k: torch.as_tensor(v, device=self.ever_active.device) for k, v in out.items()}

    def summarize(self, host: dict[str, float]) -> dict[str, Any]:
        """The summary's numbers from `readings()` read on the host (no histograms)."""
        n = self.values.n
        mean, std = mean_std(n, host["total"], host["total_sq"])
        broken = host["nonfinite"] > 0  # then "dead" and "saturated" would be artefacts of NaN
        out = {"act_fn": self.act_fn, "units": int(self.ever_active.numel()),
               "dead_fraction": None if broken else host["dead"],
               "saturated_fraction": None if broken else host["saturated"] / n,
               "nonfinite_fraction": host["nonfinite"] / n, "mean": mean, "std": std}
        if self.grad.n:
            grad_mean, grad_std = mean_std(self.grad.n, host["grad_total"], host["grad_total_sq"])
            out.update({"grad_mean": grad_mean, "grad_std": grad_std})
        return out

    def summary(self, bins: int = HIST_BINS) -> dict[str, Any]:
        readings = self.readings()
        values = torch.stack([t.double() for t in readings.values()]).tolist()  # one sync
        out = self.summarize(dict(zip(readings, values)))
        grad = {k: out.pop(k) for k in ("grad_mean", "grad_std") if k in out}
        out["hist"] = histogram(torch.cat(self.values.sample), bins)
        if grad:
            out.update({**grad, "grad_hist": histogram(torch.cat(self.grad.sample), bins)})
        return out


def _keep_sample(sample: list[torch.Tensor], values: torch.Tensor) -> None:
    kept = sum(s.numel() for s in sample)
    if kept < SAMPLE_CAP:
        sample.append(values.detach().flatten()[: SAMPLE_CAP - kept].float().cpu())


# --------------------------------------------------------------------------- runner


def mlp_layers(model: Any) -> list[str]:
    """The hook_post names of every MLP hidden layer, in order."""
    return [name for name in getattr(model, "hook_dict", {}) if POST_HOOK.search(name)]  # module order


def _act_fn(model: Any) -> str:
    act = str(getattr(model.cfg, "act_fn", "relu") or "relu").lower()
    return "gelu" if act.startswith("gelu") else "silu" if act == "swish" else act


@dataclass
class ActivationsResult:
    layers: list[dict[str, Any]]  # one per hidden layer: name, dead_fraction, ... (see module doc)
    source: str | None = None  # the text the CLI read

    def to_dict(self) -> dict[str, Any]:
        return {"layers": self.layers, **({} if self.source is None else {"source": self.source})}

    def compact(self) -> dict[str, dict[str, float]]:
        """What training logs at eval steps: {layer: {dead, saturated, nonfinite, mean, std}}."""
        return {layer["name"]: compact_row(layer) for layer in self.layers}

    def warnings(self) -> list[str]:
        return [f"{layer['name']}: {layer['nonfinite_fraction']:.0%} of activations are NaN or inf"
                for layer in self.layers if layer["nonfinite_fraction"]]

    def format(self) -> str:
        lines = [f"{'layer':<28}{'act':>6}{'units':>7}{'dead':>8}{'saturated':>11}{'mean':>11}{'std':>11}"
                 f"{'grad std':>11}"]
        for layer in self.layers:
            grad = layer.get("grad_std")
            lines.append(f"{layer['name']:<28}{layer['act_fn']:>6}{layer['units']:>7}"
                         f"{_pct(layer['dead_fraction']):>8}{_pct(layer['saturated_fraction']):>11}"
                         f"{layer['mean']:>11.4g}{layer['std']:>11.4g}"
                         f"{'-' if grad is None else f'{grad:.2e}':>11}")
        return "\n".join(lines + self.warnings())


def compact_row(layer: dict[str, Any]) -> dict[str, float | None]:
    """One layer's summary as training logs it: {dead, saturated, nonfinite, mean, std}."""
    return {"dead": layer["dead_fraction"], "saturated": layer["saturated_fraction"],
            "nonfinite": layer["nonfinite_fraction"], "mean": layer["mean"], "std": layer["std"]}


def _pct(value: float | None) -> str:
    return "nan" if value is None else f"{value:.1%}"


def run(model: Any, tokens: torch.Tensor | Iterable[torch.Tensor], *, grads: bool = True,
        saturation: float = SATURATION, batch_size: int = BATCH_SIZE, bins: int = HIST_BINS,
        tokenizer: Any = None) -> ActivationsResult:
    """Activation health of every MLP hidden layer over `tokens` [batch pos].

    With `grads`, each batch also runs backward from the mean next-token cross-entropy (so a
    batch needs 2+ positions) and the gradients at the activations are summarised too; the
    model's own .grad fields are restored afterwards. `tokens` may be text, read with
    `tokenizer` (default `model.tokenizer`) in windows of 2 n_ctx, as `--text` is.
    """
    tokens = tokens_or_text(model, tokens, tokenizer, batch_size,
                            n_ctx=2 * int(require_cfg(model, "find its MLP hook points").n_ctx))
    stats = layer_stats(model, lm_windows(model, tokens, batch_size, targets=grads), grads=grads, saturation=saturation)
    return ActivationsResult([{"name": name, **s.summary(bins)} for name, s in stats.items()])


def layer_stats(model: Any, batches: Iterable[torch.Tensor], *, grads: bool = True,
                saturation: float = SATURATION, samples: bool = True) -> dict[str, LayerStats]:
    """`run`'s sums over `batches` (the windows `lm_windows` cuts, [batch pos] each), per MLP
    hidden layer, on the model's device with nothing read on the host; `samples=False` keeps no
    sample for the histograms (`summarize`, not `summary`, reads them then)."""
    names = mlp_layers(model)
    if not names:
        raise ProbeInputError(f"{type(model).__name__} has no MLP hidden layers with hook_post to probe")
    if not 0 < saturation < 1:
        raise ProbeInputError(f"saturation must be in (0, 1), got {saturation}")
    act_fn = _act_fn(model)
    stats = {name: LayerStats(act_fn, saturation, samples=samples) for name in names}
    pres: dict[str, torch.Tensor] = {}
    device = model_device(model)
    saved_grads = {p: p.grad for p in model.parameters()}
    try:
        for batch in batches:
            _one_batch(model, batch if batch.device == device else batch.to(device), stats, pres, grads)
    finally:
        for p, g in saved_grads.items():
            p.grad = g
    return stats


def _one_batch(model: Any, batch: torch.Tensor, stats: dict[str, LayerStats],
               pres: dict[str, torch.Tensor], grads: bool) -> None:
    # each hook is told its layer by name: a bridge calls it with the aliased hook's own name
    # (`blocks.0.mlp.hook_post` fires as `blocks.0.mlp.out.hook_in`)
    def keep_pre(name: str):
        def hook(t: torch.Tensor, hook: Any) -> None:  # [batch pos d_hidden]
            pres[name] = t.detach()
        return hook

    def reduce_post(name: str):
        def hook(t: torch.Tensor, hook: Any) -> None:  # [batch pos d_hidden]
            stats[name].update(pres.pop(name), t)
        return hook

    def keep_grad(name: str):
        def hook(g: torch.Tensor, hook: Any) -> None:  # [batch pos d_hidden]
            stats[name].grad.add(g)
        return hook

    fwd = [(n.replace("hook_post", "hook_pre"), keep_pre(n)) for n in stats] + \
          [(n, reduce_post(n)) for n in stats]
    if not grads:
        with torch.no_grad():
            model.run_with_hooks(batch, fwd_hooks=fwd)
        return
    with model.hooks(fwd_hooks=fwd, bwd_hooks=[(n, keep_grad(n)) for n in stats]):
        lm_loss(model, batch).backward()


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    return run_probe(build_parser, argv, from_args)


def from_args(args: Any) -> Shown:
    from models.checkpoint import load_from_args

    snap = load_from_args(args)
    batches, source = token_batches(args, snap.tokenizer, 2 * snap.config.n_ctx, snap)  # re-windowed by run()
    result = run(snap.model, batches, grads=not args.no_grads, saturation=args.saturation,
                 batch_size=args.batch_size)
    result.source = source
    return Shown.of(result, lambda: f"{snap.name}: {source}\n{result.format()}")


if __name__ == "__main__":
    from models.cli import exit_entry
    exit_entry(main())
