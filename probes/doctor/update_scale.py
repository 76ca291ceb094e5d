"""What each optimizer's update ratio u is when healthy, so that the update-ratio rules judge every
parameter against its own optimizer: makemore's band (log10 u around -3) is what SGD and the Adam
family make at their usual rates, and a Muon step has a set size by design.

Muon (Keller Jordan 2024; torch.optim.Muon; nanochat's MuonAdamW) replaces a matrix's momentum
by the nearest semi-orthogonal matrix O (Newton-Schulz): min(m, n) singular values of about 1,
so ||O||_F = sqrt(min(m, n)) and rms(O) = 1 / sqrt(max(m, n)). It steps by lr * sqrt(max(1, m/n))
* O ("original" scaling; nanochat's too), so
    rms(step) = lr * sqrt(max(1, m/n)) / sqrt(max(m, n)) = lr / sqrt(n)    (n = cols, the fan-in)
whatever the gradient's size, and u = lr / (sqrt(n) * w). On a weight at its usual scale
(w = 1/sqrt(n)) that is u = lr: nanochat's 0.02 makes u = 0.02, 1.3 orders above makemore's
1e-3, at a healthy rate. Muon's published rates run from 1e-3 (torch.optim.Muon's default) to
0.05 (modded-nanogpt), 0.02 in Keller Jordan's and nanochat's; makemore's band -4..-2 is laid
over that range: a Muon parameter is judged by log10 u - log10(MUON_LR / (sqrt(n) * w)) - 3,
MUON_LR = 0.007 their geometric middle (the band then spans rates 7e-4 .. 0.07; a warning past
0.22, nanochat's rate times 11). Note that w cancels: Muon's u says the rate it ran at.

Adafactor (Shazeer & Stern 2018; torch.optim.Adafactor, transformers' with scale_parameter)
steps by rho_t * rms(w) * U with rms(U) clipped at 1 and rho_t = min(lr, 1/sqrt(t)), lr 1e-2 by
default: u <= rho_t by design, 1e-2 at its defaults, the band's top. Its band is moved up half
an order (centred on 10^-2.5). torch.optim.Muon with adjust_lr_fn='match_rms_adamw' scales its
step to 0.2 * lr, AdamW's size: judged as AdamW. Lion (Chen et al. 2023) steps by lr * sign(.),
u = lr / w exactly, at rates 3-10x below AdamW's: the same band as Adam.

The Adam half of a Muon optimizer (nanochat's MuonAdamW, Keller Jordan's MuonWithAuxAdam,
modded-nanogpt) trains what Muon cannot, each role at its own rate by design, two to three orders
above an AdamW rate for matrices: embedding tables at 0.2 (nanochat, times sqrt(768 / d)) to 0.6
(modded-nanogpt; the MuonWithAuxAdam docstring's example), the unembedding at 0.004 (nanochat,
likewise scaled) to 0.22 (that docstring; 0.008 in modded-nanogpt's 2024 records), scalar gains
at 0.005 (nanochat's resid lambdas) to 0.5 (its x0 lambdas; 0.04 in modded-nanogpt). Their u does
not say the rate: Adam's step is bounded near lr whatever the gradient (Kingma & Ba 2015, 2.1), and
these weights are free in scale (nanochat normalises the embedding; a gain; an unembedding grown
from zero, whose u is about 1/t while Adam builds it), so a faster rate grows them and u stays:
nanochat's default run and the same at 30 times its rates both read log10 u about -1.3 on the
embedding. The step itself does say it: rms(step) = u * w is lr * |m| / sqrt(v) per element, and
with noise-dominated gradients |m| / sqrt(v) has rms sqrt((1 - b1) / (1 + b1)) (m averages about
(1 + b1) / (1 - b1) steps of noise), 1/3 at these optimizers' b1 = 0.8. So a parameter of those
roles (embeddings, unembedding, scalars and norms), updated by Adam in a run where Muon updates
others, is judged as Muon's are: log10 u - log10(AUX_ADAM_LR[role] / (3 * w)) - 3, AUX_ADAM_LR the
geometric middle of the role's published rates (a warning once the step is 30 times that of a
healthy run). Adam on a plain run (one rate for all) keeps makemore's band: there u is what that
rate does to the matrices.

The kinds come from run.json (`optimizer_kinds`, `muon_shapes`: written by train.monitor.Monitor,
`train.monitor.optimizer_kinds`), else from its `train.optimizer` for the whole run; a run without either
(older runs, foreign logs) is judged on makemore's band as before.
"""

from __future__ import annotations

import math
from typing import Any

from probes.update_parts.report import group_of, layout_groups_of

__all__ = ["AUX_ADAM_LR", "MUON_LR", "adjusted_table", "kinds_of", "optimizer_evidence"]

REFERENCE = -3.0  # makemore's healthy log10 u: the centre of probes.update_parts.report.TARGET_BAND
MUON_LR = math.sqrt(1e-3 * 0.05)  # the geometric middle of Muon's published rates (~0.007)
SHIFT = {"adafactor": 0.5}  # orders above makemore's band where an optimizer's healthy u sits
SAME_AS_ADAM = ("sgd", "adam", "adamw", "lion", "muon_rms")
# the middle of the published Adam rates of each role a Muon optimizer leaves to Adam (docstring)
AUX_ADAM_LR = {"embeddings": math.sqrt(0.2 * 0.6), "unembedding": math.sqrt(0.004 * 0.22),
               "scalars": math.sqrt(0.005 * 0.5), "norms": math.sqrt(0.005 * 0.5)}
ADAM_NOISE = math.sqrt((1 - 0.8) / (1 + 0.8))  # rms of |m| / sqrt(v) on noise at b1 = 0.8: 1/3


def kinds_of(info: dict[str, Any]) -> tuple[dict[str, str], dict[str, list[int]], str | None]:
    """({name: kind}, {name: [rows, cols]} of Muon's parameters, the whole run's kind) from run.json."""
    kinds = info.get("optimizer_kinds")
    shapes = info.get("muon_shapes")
    optimizer = (info.get("train") or {}).get("optimizer")
    whole = None
    if isinstance(optimizer, str):
        name = optimizer.lower()
        whole = "muon_rms" if "muon" in name and (info.get("train") or {}).get("adjust_lr_fn") == "match_rms_adamw" \
            else next((k for k in ("muon", "adafactor", "lion", "adamw", "adam", "sgd") if k in name), name)
    return (kinds if isinstance(kinds, dict) else {}, shapes if isinstance(shapes, dict) else {}, whole)


def offset(kind: str | None, shape: Any, w: Any, role: str | None = None) -> float | None:
    """Orders of magnitude by which a healthy u of this optimizer sits above makemore's -3 for this
    parameter (0 for SGD and the Adam family); None where it cannot be told (a Muon parameter
    without its shape or weight). `role`: the parameter's group where Adam updates it beside a
    Muon (its step judged against the role's published rate), else None."""
    if kind in SHIFT:
        return SHIFT[kind]
    if kind == "muon":
        if not (isinstance(shape, list) and len(shape) == 2 and all(isinstance(x, int) and x > 0 for x in shape)):
            return None
        return healthy_step_orders(MUON_LR / math.sqrt(shape[1]), w)
    if role in AUX_ADAM_LR:
        return healthy_step_orders(AUX_ADAM_LR[role] * ADAM_NOISE, w)
    return 0.0


def healthy_step_orders(step: float, w: Any) -> float | None:
    """Orders above makemore's -3 of the u that a healthy step of rms `step` makes on weights of
    rms w; None without a usable w."""
    if not (isinstance(w, (int, float)) and math.isfinite(w) and w > 0):
        return None
    return math.log10(step / w) - REFERENCE


def aux_adam_role(beside_muon: bool, name: str, kind: str | None,
                  layout_groups: dict[str, str] | None = None) -> str | None:
    """The role (the parameter's group: the run's layout's, else its name's) of a parameter Adam
    updates in a run where Muon updates others (`beside_muon`); None otherwise."""
    if kind not in ("adam", "adamw") or not beside_muon:
        return None
    return group_of(name, layout_groups)


def adjusted_table(info: dict[str, Any], table: dict[str, Any]) -> dict[str, Any]:
    """The g/w/u table with each parameter's u moved onto makemore's scale: u / 10^offset, so
    that the rules' band and thresholds judge it against its own optimizer. The table itself
    when nothing moves (SGD, the Adam family, an older run)."""
    kinds, shapes, whole = kinds_of(info)
    if not kinds and whole in (None, *SAME_AS_ADAM):
        return table
    beside_muon = "muon" in kinds.values()  # once per table, not per parameter
    layout = layout_groups_of(info) if beside_muon else {}
    out = {}
    for name, row in table.items():
        kind = kinds.get(name, whole)
        u = row.get("u") if isinstance(row, dict) else None
        moved = offset(kind, shapes.get(name), row.get("w"), aux_adam_role(beside_muon, name, kind, layout)) \
            if isinstance(u, (int, float)) else None
        out[name] = row if not moved else {**row, "u": u / 10 ** moved}
    return out


def optimizer_evidence(info: dict[str, Any], names: list[str]) -> dict[str, str]:
    """{"optimizers": "muon 8, adamw 2 (u judged against each one's own healthy u)"} for the
    parameters a finding names, where some optimizer's band is not makemore's; else {}."""
    kinds, _, whole = kinds_of(info)
    counts: dict[str, int] = {}
    for name in names:
        kind = kinds.get(name, whole) or "not logged"
        counts[kind] = counts.get(kind, 0) + 1
    if all(kind in SAME_AS_ADAM for kind in counts):
        return {}
    shown = ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    return {"optimizers": f"{shown} (u judged against each one's own healthy u: log10 u as makemore's scale)"}
