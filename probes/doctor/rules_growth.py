"""The run doctor's rules that fit models we never rebuilt (nanochat, Hugging Face Llama-family,
tutorial GPTs), judged against each run's own start rather than fixed levels:

- `resid_rms_growth`: the residual stream's rms grew ten-fold from its first logged value and is
  still growing. nanochat at 1000x its learning rate: 12.7 -> 3.6e5 in 10 steps, its first sign
  (QK-norm bounds its attention scores and its softcap pins its output logits, so neither of
  those rules can see it); a tutorial GPT warmed up to too high a rate: 1.5 -> 16 twenty steps
  in, sixty steps before its loss blew up.
- `window_uniform`: sliding-window layers (run.json's `model.attn_windows`, measured by the
  Monitor from the attention mask) attend uniformly: judged against the uniform entropy of their
  window, not ln(n!)/n of the whole context, which they can never reach.

Same contract as `probes.doctor.rules_internals`.
"""

from __future__ import annotations

import math
from typing import Any

from probes.doctor.finding import WORTSMAN, Finding, rule
from probes.doctor.rules_internals import before_nonfinite, head_names, recent_growth
from probes.doctor.run_history import RunHistory
from probes.doctor.signals import layer_values, ten_fold
from probes.doctor.thresholds import DoctorThresholds
from probes.timeline import stayed_from

__all__ = ["RULES", "resid_rms_growth", "window_uniform", "window_uniform_entropy"]


def largest_rms(record: dict[str, Any]) -> float:
    values = [v for vs in layer_values(record.get("resid_rms")).values() for v in vs if math.isfinite(v)]
    return max(values) if values else math.nan


@rule("resid_rms_growth")
def resid_rms_growth(h: RunHistory, t: DoctorThresholds) -> list[Finding]:
    records = [r for r in before_nonfinite(h) if r.get("resid_rms")]
    if not records:
        return []  # the growth rules that read the same eval steps say what was not logged
    hit = ten_fold(records, largest_rms, t.growth_orders, t.growth_floor)
    if not hit:
        return []
    start, peak = largest_rms(records[0]), max(v for r in records if math.isfinite(v := largest_rms(r)))
    latest = recent_growth(records, largest_rms)
    growing = latest >= t.level_growth or peak >= max(start, t.growth_floor) * 10 ** (2 * t.growth_orders)
    layers = [l for l in sorted(layer_values(records[-1]["resid_rms"]), key=lambda l: (len(l), l))
              if ten_fold(records, lambda r, l=l: (layer_values(r["resid_rms"]).get(l) or [math.nan])[0],
                          t.growth_orders, t.growth_floor)]  # the layers that grew ten-fold themselves
    title = f"the residual stream's rms grew {peak / start:.3g}x, from {start:.3g} to {peak:.3g}"
    return [Finding(
        "resid_rms_growth", "warning" if growing else "info",
        title if growing else title + ", then levelled off", step=hit[0],
        where=tuple(f"layer {l}" for l in layers),
        evidence={"start": start, "peak": peak, "growth": peak / start, "latest_quarter_growth": latest},
        cause="each update adds more to the residual stream than the norms take out: activations "
              "grow without bound, and the loss follows them up (the learning rate is too high for "
              "this model)" if growing else "the activations grew while the model learned, and "
              f"stopped growing (under {t.level_growth:g}x over the latest quarter of the run)",
        fix="lower the learning rate (or the matrix weights' rate), or add warmup" if growing else "",
        reference=WORTSMAN, page="dynamics")]


def window_uniform_entropy(n: int, window: int) -> float:
    """Mean entropy of causal rows 0..n-1 each attending uniformly over its last min(i+1, window)
    keys (ln(n!)/n when window >= n)."""
    return sum(math.log(min(i + 1, window)) for i in range(n)) / n


@rule("window_uniform")
def window_uniform(h: RunHistory, t: DoctorThresholds) -> list[Finding]:
    windows = h.model.get("attn_windows")
    n = h.model.get("n_ctx")
    if not isinstance(windows, dict) or not windows:
        return []  # no sliding-window layer measured: the attention rule judges every layer
    if not isinstance(n, int) or n < 2:
        raise h.not_logged("context length", "no n_ctx in run.json")
    records = [r for r in before_nonfinite(h) if r.get("attn_entropy")]
    if len(records) < 2:
        return []  # none: the attention rule says so; one: nothing has stayed uniform yet
    steps = [r["step"] for r in records]
    uniform = []  # (layer, head, since)
    for layer, window in windows.items():
        limit = t.uniform_fraction * window_uniform_entropy(n, int(window))
        rows = [layer_values(r["attn_entropy"]).get(str(layer), []) for r in records]
        for head in range(len(rows[-1])):
            flags = [head < len(row) and math.isfinite(row[head]) and row[head] > limit for row in rows]
            since = stayed_from(steps, flags)
            if since is not None:
                uniform.append((int(layer), head, since))
    if not uniform:
        return []
    return [Finding(
        "window_uniform", "info", f"{len(uniform)} head{'s' if len(uniform) > 1 else ''} of sliding-window "
        "layers attend uniformly over their window", step=min(s for *_, s in uniform),
        where=head_names([(l, hd) for l, hd, _ in uniform]),
        evidence={"heads": len(uniform), "windows": {str(k): v for k, v in windows.items()}},
        cause="their entropy stays near that of uniform attention over the keys their window lets "
              "them see: they average rather than select", fix="",
        reference=WORTSMAN, page="dynamics")]


RULES = (resid_rms_growth, window_uniform)  # registered in probes.doctor.diagnosis
