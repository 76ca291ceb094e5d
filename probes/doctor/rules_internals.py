"""The run doctor's rules on what the model does inside: attention entropy (collapse, uniform
heads), attention- and output-logit growth, dead and saturated units (the update ratios:
`probes.doctor.rules_updates`). Same contract as `probes.doctor.rules_loss`."""

from __future__ import annotations

import math
from typing import Any

from probes.doctor.finding import MAKEMORE_ACTIVATIONS, SERIES_ATTENTION, WORTSMAN, ZHAI, Finding, NotChecked, rule
from probes.doctor.run_history import RunHistory, as_float
from probes.doctor.signals import first_nonfinite, layer_values, ten_fold
from probes.doctor.thresholds import DoctorThresholds
from probes.timeline import entropy_timeline, stayed_from

__all__ = ["activations", "attention", "attn_logit_growth", "output_logit_growth"]


def before_nonfinite(h: RunHistory) -> list[dict[str, Any]]:
    """The records before the first one holding a NaN (what a diverged run was doing until then)."""
    bad = first_nonfinite(h)
    return [r for r in h.records if bad is None or r["step"] < bad[0]]


def head_names(pairs: list[tuple[int, int]]) -> tuple[str, ...]:
    return tuple(f"L{l}H{h}" for l, h in pairs)


# ------------------------------------------------------------------ attention entropy

@rule("attention_collapse", "uniform_heads")
def attention(h: RunHistory, t: DoctorThresholds) -> list[Finding]:
    records = [r for r in before_nonfinite(h) if r.get("attn_entropy")]
    n_ctx = h.model.get("n_ctx")
    if not records:
        raise h.not_logged("attention entropy", "no attention entropy (a model without attention, or no eval steps)")
    if not isinstance(n_ctx, int) or n_ctx < 2:
        raise h.not_logged("context length", "no n_ctx in run.json or a snapshot's config.json")
    timeline = entropy_timeline(records, n_ctx, collapse=t.collapse_fraction, uniform=t.uniform_fraction)
    findings = []
    collapsed = [(l, hd, s) for l, row in enumerate(timeline.collapsed) for hd, s in enumerate(row) if s is not None]
    if collapsed:
        findings.append(collapse_finding(h, timeline, collapsed, records))
    uniform = [(l, hd) for l, row in enumerate(timeline.uniform) for hd, s in enumerate(row) if s is not None]
    if uniform and timeline.last_step > timeline.first_step:
        findings.append(uniform_finding(timeline, uniform))
    return findings


def collapse_finding(h: RunHistory, timeline: Any, collapsed: list[tuple[int, int, int]],
                     records: list[dict[str, Any]]) -> Finding:
    whole = [l for l, row in enumerate(timeline.collapsed) if row and all(s is not None for s in row)]
    step = min(s for _, _, s in collapsed)
    last = timeline.final_entropy
    lowest = min(last[l][hd] for l, hd, _ in collapsed)
    evidence: dict[str, Any] = {"heads_collapsed": len(collapsed), "lowest_entropy_nats": lowest,
                                "uniform_entropy_nats": timeline.uniform_nats,
                                "fraction_of_uniform": lowest / timeline.uniform_nats}
    logits = [max(vs) for r in records for vs in [max_head_logit(r)] if vs]
    if logits:
        evidence.update({"attn_logit_max_start": logits[0], "attn_logit_max_last": logits[-1]})
    unscaled = h.model.get("attn_scale") == "none"
    where = tuple(f"layer {l} (all heads)" for l in whole) or head_names([(l, hd) for l, hd, _ in collapsed])
    return Finding(
        "attention_collapse", "failed" if whole else "warning",
        f"attention collapsed to one-hot in {', '.join(where)} from step {step} "
        f"(entropy {lowest:.3g} nats, uniform is {timeline.uniform_nats:.2f})", step=step,
        warning_step=step, where=where, evidence=evidence,
        cause=("the scores q.k are not divided by sqrt(d): they grow with d, the softmax saturates "
               "on one key and its gradient vanishes (entropy collapse)") if unscaled else
              "the attention scores grew until the softmax saturated on one key; the gradient "
              "through it vanishes and the head stops learning (entropy collapse)",
        fix="scale the scores by 1/sqrt(d) (--set attn_scale=sqrt_d_model, as the series did) and "
            "keep a residual path" if unscaled else
            f"lower the learning rate, or {qk_norm_fix(h)}; Zhai et al. bound the scores with sigma-reparam",
        reference=f"{SERIES_ATTENTION}; {ZHAI}" if unscaled else ZHAI, page="dynamics")


def uniform_finding(timeline: Any, uniform: list[tuple[int, int]]) -> Finding:
    layers = sorted({l for l, _ in uniform})
    step = min(timeline.uniform[l][hd] for l, hd in uniform)
    return Finding(
        "uniform_heads", "info", f"{len(uniform)} head{'s' if len(uniform) > 1 else ''} "
        f"attend{'s' if len(uniform) == 1 else ''} almost uniformly (layer{'s' if len(layers) > 1 else ''} "
        f"{', '.join(map(str, layers))}): {'they average' if len(uniform) > 1 else 'it averages'} the context",
        step=step, where=head_names(uniform),
        evidence={"heads": len(uniform), "uniform_entropy_nats": timeline.uniform_nats,
                  "threshold_fraction": timeline.thresholds["uniform"]},
        cause="the head's scores barely differ between keys, so it passes the mean of its context",
        fix=("often harmless in a first layer; " if layers == [0] else "")
            + "if many heads stay uniform they are spare capacity: "
            "fewer or wider heads, or a higher learning rate for attention",
        reference="Clark et al. 2019, What Does BERT Look At? (broad attention heads)", page="attention")


# ------------------------------------------------------------------ logit growth

def qk_norm_fix(h: RunHistory) -> str:
    """QK-norm as the run's trainer spells it; for a run that has it already, what is left."""
    if h.model.get("qk_norm", "none") != "none":
        return f"add warmup (its queries and keys are normalised already: qk_norm={h.model['qk_norm']})"
    return f"normalise queries and keys (QK-norm: {h.flag('--set qk_norm=rms')})"


def max_head_logit(record: dict[str, Any]) -> list[float]:
    return [v for vs in layer_values(record.get("attn_logit_max")).values() for v in vs if math.isfinite(v)]


@rule("attn_logit_growth")
def attn_logit_growth(h: RunHistory, t: DoctorThresholds) -> list[Finding]:
    records = [r for r in before_nonfinite(h) if r.get("attn_logit_max")]
    if not records:
        raise h.not_logged("max attention logit", "attn_logit_max is not in metrics.jsonl (a run trained before "
                         "it was logged, or a model without attention)")
    flagged = []  # (layer, head, step it grew ten-fold, first value, peak, growth over the latest quarter)
    for layer, heads in layer_values(records[-1]["attn_logit_max"]).items():
        for head in range(len(heads)):
            pick = lambda r, l=layer, i=head: (lambda vs: vs[i] if i < len(vs) else math.nan)(  # noqa: E731
                layer_values(r["attn_logit_max"]).get(l, []))
            hit = ten_fold(records, pick, t.growth_orders, t.growth_floor)
            peak = max((v for r in records if math.isfinite(v := pick(r))), default=math.nan)
            if hit and peak >= t.attn_logit_max:
                flagged.append((int(layer), head, hit[0], pick(records[0]), peak, recent_growth(records, pick)))
    if not flagged:
        return []
    step = min(f[2] for f in flagged)
    worst = max(flagged, key=lambda f: f[4])
    # still growing, or grown past anything a sharp head needs (ten times the one-hot score gap)
    latest = max(f[5] for f in flagged)
    growing = latest >= t.level_growth or worst[4] >= 10 * t.attn_logit_max
    title = (f"attention logits grew more than ten-fold in {len(flagged)} head{'s' if len(flagged) > 1 else ''}, "
             f"to {worst[4]:.3g} in L{worst[0]}H{worst[1]}")
    return [Finding(
        "attn_logit_growth", "warning" if growing else "info",
        title if growing else title + ", then levelled off (sharp heads, not a runaway)",
        step=step, where=head_names([(f[0], f[1]) for f in flagged]),
        evidence={"heads": len(flagged), "start": worst[3], "peak": worst[4],
                  "growth": worst[4] / worst[3] if worst[3] > 0 else math.nan,
                  "latest_quarter_growth": latest},
        cause="query and key weights grow together, so the scores grow quadratically and the "
              "softmax heads for one-hot (the precursor of entropy collapse and loss spikes)"
              if growing else "the scores grew while the heads learned to attend sharply, and stopped "
              f"growing (under {t.level_growth:g}x over the latest quarter of the run)",
        fix=f"{qk_norm_fix(h)} or lower the learning rate" if growing else "",
        reference=WORTSMAN, page="dynamics")]


def recent_growth(records: list[dict[str, Any]], value: Any) -> float:
    """How many times value(record) grew over the latest quarter of the logged steps: the last
    record's against the last one at or before that quarter began (the one before the last at least)."""
    series = [(r["step"], v) for r in records if math.isfinite(v := value(r))]
    if len(series) < 2:
        return math.inf
    since = series[-1][0] - (series[-1][0] - series[0][0]) / 4
    base = next(v for s, v in reversed(series[:-1]) if s <= since)
    return series[-1][1] / base if base > 0 else math.inf


@rule("output_logit_growth")
def output_logit_growth(h: RunHistory, t: DoctorThresholds) -> list[Finding]:
    records = [r for r in before_nonfinite(h) if "logit_max" in r]
    if not records:
        raise h.not_logged("max output logit", "logit_max is not in metrics.jsonl (a run trained before it was logged)")
    value = lambda r: as_float(r.get("logit_max"))  # noqa: E731
    hit = ten_fold(records, value, t.growth_orders, t.growth_floor)
    peak = max((v for r in records if math.isfinite(v := value(r))), default=math.nan)
    if not hit or not peak >= t.output_logit_max:
        return []
    return [Finding(
        "output_logit_growth", "warning", f"the largest output logit grew {hit[1]:.3g}x, to {peak:.3g}",
        step=hit[0], where=("output logits",),
        evidence={"start": value(records[0]), "peak": peak, "growth_at_step": hit[1]},
        cause="the output logits drift apart from the log-probabilities' scale (output-logit "
              "divergence): the softmax saturates and the loss becomes unstable",
        fix=f"add a z-loss ({h.flag('--z-loss 1e-4')}) or weight decay on the unembedding "
            f"({h.flag('--unembed-weight-decay 0.1')})",
        reference=WORTSMAN, page="dynamics")]


# ------------------------------------------------------------------ update ratios

# a parameter's block: its name's first numbered part (ours `blocks.0.`, `layers.0.`, `h.0.`, `trf_blocks.0.`)
@rule("dead_units", "sparse_units", "saturated_units")
def activations(h: RunHistory, t: DoctorThresholds) -> list[Finding]:
    logged = [r for r in before_nonfinite(h) if isinstance(r.get("activations"), dict) and r["activations"]]
    if not logged:
        why = (h.info.get("model") or {}).get("activations") if isinstance(h.info.get("model"), dict) else None
        if isinstance(why, str) and why.startswith("not measured"):  # the Monitor said why (run.json)
            raise NotChecked(f"{why} (run.json)")
        raise h.not_logged("activation health", "no activation health in metrics.jsonl (no eval steps, or a "
                         "run trained before it was logged)")
    # the init's reading is no training's doing (and a small eval batch leaves many units unlit then):
    # judged from the first reading after an update on, so an eval at step 0 changes no verdict
    logged = [r for r in logged if r["step"] > h.first_step]
    if not logged:
        return []
    act_fn = h.model.get("act_fn", "relu")  # our configs and older runs: ReLU unless they say; a Monitor's: what it found
    last = {layer: (as_float(s.get("dead")), as_float(s.get("saturated")))
            for layer, s in logged[-1]["activations"].items() if isinstance(s, dict)}
    history = [(r["step"], r["activations"]) for r in logged]
    dead = {l: d for l, (d, _) in last.items() if d >= t.dead_info}
    # a ReLU layer mostly at zero whose units all still fire somewhere is sparse, not dead
    sparse = {l: zeros for l, (_, zeros) in last.items()
              if act_fn == "relu" and l not in dead and zeros >= t.relu_zero_info}
    flat = {l: sat for l, (_, sat) in last.items() if act_fn != "relu" and sat >= t.saturated_info}
    findings = [dead_finding(dead, last, act_fn, history, t, h.flag("--set act_fn=gelu"))] if dead else []
    findings += [sparse_finding(sparse, last, history, t)] if sparse else []
    return findings + ([saturated_finding(flat, act_fn, history, t)] if flat else [])


def since(history: list[tuple[int, dict]], layer: str, key: str, limit: float) -> int:
    """The logged step from which `layer`'s `key` stayed at or above `limit`."""
    flags = [as_float((stats.get(layer) or {}).get(key)) >= limit for _, stats in history]
    start = stayed_from([s for s, _ in history], flags)
    return start if start is not None else history[-1][0]


def dead_finding(dead: dict[str, float], last: dict[str, tuple[float, float]], act_fn: str,
                 history: list[tuple[int, dict]], t: DoctorThresholds, gelu: str) -> Finding:
    worst = max(dead, key=lambda l: (dead[l], last[l][1]))
    share, zeros = last[worst]
    relu = act_fn == "relu" and math.isfinite(zeros)
    zero_text = f", {zeros:.0%} of its ReLU outputs are zero" if relu else ""
    return Finding(
        "dead_units", "warning" if dead[worst] >= t.dead_warning else "info",
        f"{worst}: {share:.0%} of units dead (never active on the eval batch){zero_text}{more(dead)}",
        step=min(since(history, l, "dead", t.dead_info) for l in dead), where=tuple(dead),
        evidence={"dead_share": share, **({"zero_share": zeros} if relu else {}),
                  "act_fn": act_fn or "not recorded", **{f"dead {l}": d for l, d in dead.items() if l != worst}},
        cause="units whose input never turns positive get no gradient and never come back (dead "
              "ReLUs): the layer works with less than its width" if act_fn == "relu" else
              f"units whose input stays far below zero output ~0 and pass almost no gradient back "
              f"({act_fn or 'the activation run.json records is unknown'}): the layer works with less than its width",
        fix="lower the learning rate or fix the init (Kaiming: std = gain / sqrt(fan_in))" + (
            f"; a smoother activation (GELU: {gelu}) keeps units alive" if act_fn == "relu" else
            "; normalise the MLP's input so its pre-activations stay near zero"),
        reference=MAKEMORE_ACTIVATIONS, page="dynamics")


def sparse_finding(sparse: dict[str, float], last: dict[str, tuple[float, float]],
                   history: list[tuple[int, dict]], t: DoctorThresholds) -> Finding:
    """A ReLU layer whose outputs are mostly zero while every unit fires on some input: a note, not
    a fault (no fix; it would be `dead_units` if units stopped firing altogether)."""
    worst = max(sparse, key=sparse.get)
    dead = last[worst][0]
    alive = "every unit is active" if dead == 0 else f"all but {dead:.0%} of its units are active"
    return Finding(
        "sparse_units", "info", f"{worst}: {sparse[worst]:.0%} of its ReLU outputs are zero, yet {alive} "
        f"on some of the eval batch{more(sparse)}",
        step=min(since(history, l, "saturated", t.relu_zero_info) for l in sparse), where=tuple(sparse),
        evidence={"zero_share": sparse[worst], "dead_share": last[worst][0], "act_fn": "relu",
                  **{f"zero {l}": z for l, z in sparse.items() if l != worst}},
        cause="each input switches on a few units and different inputs different ones: a sparse code, "
              "with (nearly) the layer's whole width in use and receiving gradient",
        fix="", reference=MAKEMORE_ACTIVATIONS, page="dynamics")


def more(layers: dict[str, float]) -> str:
    """' (and 2 more layers)' past the first layer named, or nothing."""
    n = len(layers) - 1
    return f" (and {n} more layer{'s' if n > 1 else ''})" if n else ""


def saturated_finding(flat: dict[str, float], act_fn: str, history: list[tuple[int, dict]],
                      t: DoctorThresholds) -> Finding:
    worst = max(flat, key=flat.get)
    return Finding(
        "saturated_units", "warning" if flat[worst] >= t.saturated_warning else "info",
        f"{worst}: {flat[worst]:.0%} of {act_fn or 'its'} activations in the flat tail{more(flat)}",
        step=min(since(history, l, "saturated", t.saturated_info) for l in flat), where=tuple(flat),
        evidence={"saturated_share": flat[worst], "act_fn": act_fn,
                  **{f"saturated {l}": v for l, v in flat.items() if l != worst}},
        cause=f"pre-activations too large in magnitude put {act_fn} where its slope is ~0, so "
              "little gradient flows back through those units",
        fix="shrink the layer's init (makemore: tanh gain 5/3 / sqrt(fan_in)) or normalise its input",
        reference=MAKEMORE_ACTIVATIONS, page="dynamics")
