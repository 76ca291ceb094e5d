"""The result type of `probes.updates`: g / w / u per parameter, grouped, flagged, printable.

One `UpdateReport` per optimizer step (from a run's log, from two snapshots, or from one step
taken on a copy); an `UpdateHistory` is the reports of every logged step of a run, with flat
records for charts. Pure Python: no torch, so the app and the CLI can read logs cheaply.

Groups follow the series' story (attention Q/K barely moving under SGD while the MLP moves a
hundred times faster): embeddings, attention Q/K, attention V/O, MLP, norms, unembedding.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping

TARGET_BAND = (-4.0, -2.0)  # log10(u) outside this is flagged slow / fast (makemore: ~ -3)
GROUPS = ("embeddings", "attention Q/K", "attention V/O", "MLP", "norms", "unembedding", "scalars", "other")
FLAGS = ("slow", "fast", "frozen", "from zero", "non-finite")
STATS = ("g", "w", "u", "u_nominal")

Row = dict[str, float | None]

# a norm's module: ours (rms1), GPT-2's (ln_1, ln_f), tutorials' (norm1, ln1, n1, final_norm), HF's (*layernorm)
_NORM = re.compile(r"(ln|norm|rms|n|layernorm|layer_norm)(_?(\d+|f|final|out))?$")
_QK = {"W_Q", "W_K", "b_Q", "b_K", "q", "k", "q_proj", "k_proj", "query", "key",
       "c_q", "c_k", "W_query", "W_key", "wq", "wk"}  # nanochat, tutorials, Meta's Llama
_VO = {"W_V", "W_O", "b_V", "b_O", "v", "o", "v_proj", "o_proj", "value",
       "c_v", "W_value", "wv", "wo", "ve_gate"}  # ve_gate: nanochat's gate on its value embeddings
_ATTN_OUT = {"c_proj", "out_proj", "dense", "proj"}  # an attention block's output projection (GPT-2, OPT, tutorials)
_ATTN = {"attn", "attention", "self_attn", "self_attention", "att", "sa", "mha"}
_EMBED = {"embedding", "embed", "W_E", "W_pos", "pos_embed", "wte", "wpe", "embed_tokens",
          "embed_positions", "tok_embed", "pos",  # these two: TransformerLens's native model
          "tok_emb", "pos_emb", "token_embedding_table", "position_embedding_table", "tok_embeddings",
          "value_embeds", "embed_in"}  # tutorials, Meta's Llama, nanochat's value embeddings, GPT-NeoX
_UNEMBED = {"W_out", "b_out", "W_U", "b_U", "unembed", "lm_head", "head", "out_head", "output", "embed_out"}
_MLP = {"mlp", "ffn", "feed_forward", "ff", "ffwd", "c_fc", "gate_proj", "up_proj", "down_proj", "fc1", "fc2"}
_SCALAR = re.compile(r"\w*_lambdas?$|smear_gate$")  # nanochat's resid/x0/smear/backout gains


def _is_norm(part: str) -> bool:
    return bool(_NORM.fullmatch(part)) or part.endswith("norm")  # input_layernorm, final_norm, ...


def parameter_group(name: str) -> str:
    """The group of a parameter, by our (series') names, TransformerLens' ones, nanoGPT's and
    Hugging Face GPT-2's (``attn.c_attn.q.weight``: the Q rows of a packed c_attn, see
    `probes.updates.named_trainable`; a packed ``qkv`` or ``query_key_value`` likewise), nanochat's
    (``c_q``, ``value_embeds``, its scalar ``*_lambdas``), Hugging Face Llama-family ones
    (``q_proj``, ``gate_proj``, ``input_layernorm``, ``embed_tokens``) and the names tutorials
    write (``W_query``, ``out_proj``, ``ffwd``, ``norm1``, ``tok_emb``, ``out_head``, ...)."""
    parts = name.split(".")
    if any(_is_norm(p) for p in parts):
        return "norms"
    if parts[-1] in _QK or (len(parts) > 1 and parts[-2] in _QK):
        return "attention Q/K"
    if parts[-1] in _VO or (len(parts) > 1 and parts[-2] in _VO):
        return "attention V/O"
    if len(parts) > 1 and parts[-2] in _ATTN_OUT and _ATTN & set(parts):
        return "attention V/O"
    if _MLP & set(parts):
        return "MLP"
    if parts[0] in _EMBED or (len(parts) > 1 and parts[-2] in _EMBED):
        return "embeddings"
    if parts[0] in _UNEMBED:
        return "unembedding"
    if any(_SCALAR.fullmatch(p) for p in parts):
        return "scalars"
    return "other"


def group_of(name: str, layout_groups: Mapping[str, str] | None = None) -> str:
    """The group the run's layout gave the parameter (run.json's `model.parameter_groups`, which
    the Monitor writes for a model it read through the tap: `probes.update_parts.groups`), else its
    name's (`parameter_group`)."""
    group = (layout_groups or {}).get(name)
    return group if group in GROUPS else parameter_group(name)


def layout_groups_of(info: Mapping[str, Any] | None) -> dict[str, str]:
    """run.json's `model.parameter_groups` ({} where it has none, or not as a {name: group} map)."""
    model = (info or {}).get("model") if isinstance(info, Mapping) else None
    groups = model.get("parameter_groups") if isinstance(model, Mapping) else None
    return {k: v for k, v in groups.items() if isinstance(v, str)} if isinstance(groups, Mapping) else {}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def band_in_order(lo: Any, hi: Any) -> bool:
    """A g/w/u band is two finite log10 values LO < HI (the report's and the CLI's rule)."""
    return _finite(lo) and _finite(hi) and lo < hi


def log10_or_none(value: float | None) -> float | None:
    return math.log10(value) if _finite(value) and value > 0 else None


def row_flags(row: Mapping[str, Any], band: tuple[float, float]) -> list[str]:
    """`non-finite` (w missing or any stat NaN/inf: a JSON null w means NaN, since rms always
    exists), `frozen` (u == 0), `from zero` (u = |update| / |w| undefined: the weight was all
    zeros before the step, as a zero-initialised output projection is), else `slow` / `fast`
    outside the band."""
    values = [row.get(key) for key in STATS]
    if row.get("w") is None or any(v is not None and not _finite(v) for v in values):
        return ["non-finite"]
    u = row.get("u")
    if u == 0:
        return ["frozen"]
    if u is None and row["w"] > 0:  # it moved off zero: its whole weight is this update
        return ["from zero"]
    lu = log10_or_none(u)
    if lu is None:
        return []
    return ["slow"] if lu < band[0] else ["fast"] if lu > band[1] else []


def _sci(value: float | None) -> str:
    return "-" if value is None else f"{value:.1e}"


@dataclass
class UpdateReport:
    """g / w / u of one step. `parameters` = {name: {g, w, u, u_nominal, log10_u}}."""

    parameters: dict[str, Row]
    band: tuple[float, float] = TARGET_BAND
    step: int | None = None
    source: str = "run"  # run | between | step
    lr: float | None = None
    span: int | None = None  # optimizer steps between the two snapshots (source "between")
    text: str | None = None  # the text the step read, as the CLI describes it (source "step")
    layout_groups: Mapping[str, str] | None = None  # run.json's parameter_groups: decided before the names
    group_of: dict[str, str] = field(init=False)
    flags: dict[str, list[str]] = field(init=False)
    groups: dict[str, dict[str, Any]] = field(init=False)  # {group: {median_log10_u, parameters}}
    spread: float | None = field(init=False)  # orders of magnitude between the extreme groups

    def __post_init__(self) -> None:
        lo, hi = self.band
        if not band_in_order(lo, hi):
            raise ValueError(f"band must be two finite log10 values LO < HI, got {self.band}")
        self.parameters = {name: {**{k: row.get(k) for k in STATS},
                                  "log10_u": log10_or_none(row.get("u"))}
                           for name, row in self.parameters.items()}
        self.group_of = {name: group_of(name, self.layout_groups) for name in self.parameters}
        self.flags = {name: f for name, row in self.parameters.items() if (f := row_flags(row, self.band))}
        self.groups = self._groups()  # computed once: format, summary and charts read them often
        medians = [g["median_log10_u"] for g in self.groups.values() if g["median_log10_u"] is not None]
        self.spread = max(medians) - min(medians) if len(medians) > 1 else None

    @classmethod
    def from_table(cls, table: Mapping[str, Mapping[str, Any]], **kwargs: Any) -> UpdateReport:
        return cls({name: dict(row) for name, row in table.items()}, **kwargs)

    def _groups(self) -> dict[str, dict[str, Any]]:
        """{group: {median_log10_u, parameters}} for the groups this model has, in GROUPS order."""
        out: dict[str, dict[str, Any]] = {}
        for group in GROUPS:
            names = [n for n, g in self.group_of.items() if g == group]
            if names:
                logs = [self.parameters[n]["log10_u"] for n in names]
                logs = [v for v in logs if v is not None]
                out[group] = {"median_log10_u": statistics.median(logs) if logs else None,
                              "parameters": names}
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "source": self.source, "lr": self.lr, "span": self.span,
                **({} if self.text is None else {"text": self.text}), "band": list(self.band),
                "parameters": self.parameters, "groups": self.groups, "spread": self.spread,
                "flags": self.flags}

    def format(self, name_width: int = 36) -> str:
        """The series' table (`W_Q  g=5.5e-05 w=5.8e-02 u=4.8e-05`) with flags, then the groups."""
        title = f"g / w / u at step {self.step}" if self.step is not None else "g / w / u"
        lines = [f"{title} ({self.source}); band log10(u) in [{self.band[0]:g}, {self.band[1]:g}]"]
        if self.span and self.span > 1:
            lines.append(f"u accumulated over {self.span} steps: the band is for one step")
        if self.text:
            lines.append(f"on {self.text}")
        lines += self.table_lines(name_width)
        lines.append("groups (median log10 u):")
        for group, info in self.groups.items():
            median = info["median_log10_u"]
            lines.append(f"    {group:<16}{'-' if median is None else f'{median:+.2f}':>7}"
                         f"  ({len(info['parameters'])} parameters)")
        if self.spread is not None:
            lines.append(f"spread between groups: {self.spread:.2f} orders of magnitude")
        if self.flags:
            lines.append(f"flagged: {len(self.flags)} of {len(self.parameters)} parameters")
        return "\n".join(lines)

    def table_lines(self, name_width: int = 36) -> list[str]:
        """One row per parameter in the series' format, log10(u), u_nominal and flags appended."""
        width = max([name_width] + [len(n) + 2 for n in self.parameters])
        lines = []
        for name, row in self.parameters.items():
            lu = row["log10_u"]
            flag = " " + ",".join(self.flags[name]) if name in self.flags else ""
            lines.append(f"    {name:<{width}}g={_sci(row['g'])} w={_sci(row['w'])} u={_sci(row['u'])}"
                         f" log10(u)={'-' if lu is None else f'{lu:+.1f}'}"
                         f" u_nom={_sci(row['u_nominal'])}{flag}")
        return lines

    def summary(self) -> str:
        """One line: the group medians and the spread (training's console uses it)."""
        parts = [f"{group} {info['median_log10_u']:+.1f}" for group, info in self.groups.items()
                 if info["median_log10_u"] is not None]
        spread = "" if self.spread is None else f" | spread {self.spread:.1f}"
        flagged = f" | {len(self.flags)} flagged" if self.flags else ""
        return "log10 u: " + ", ".join(parts) + spread + flagged


@dataclass
class UpdateHistory:
    """The reports of every logged step of a run, oldest first."""

    reports: list[UpdateReport]

    @property
    def steps(self) -> list[int]:
        return [r.step for r in self.reports]

    @property
    def latest(self) -> UpdateReport:
        return self.reports[-1]

    def at(self, step: int) -> UpdateReport:
        for report in self.reports:
            if report.step == step:
                return report
        shown = self.steps if len(self.steps) <= 8 else self.steps[:3] + ["..."] + self.steps[-3:]
        raise ValueError(f"step {step} has no g/w/u record; logged steps: "
                         f"{', '.join(map(str, shown))}")

    def records(self) -> list[dict[str, Any]]:
        """Flat rows for charts: {step, name, group, g, w, u, u_nominal, log10_u}."""
        return [{"step": r.step, "name": name, "group": r.group_of[name], **row}
                for r in self.reports for name, row in r.parameters.items()]

    def group_records(self) -> list[dict[str, Any]]:
        """{step, group, median_log10_u} per step and group."""
        return [{"step": r.step, "group": group, "median_log10_u": info["median_log10_u"]}
                for r in self.reports for group, info in r.groups.items()]

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "groups": self.group_records(),
                "reports": [r.to_dict() for r in self.reports]}

    def format(self) -> str:
        """Median log10 u per group (columns) over steps (rows)."""
        groups = list(self.latest.groups)
        lines = ["median log10(u) per group over steps", "step".rjust(8) + "".join(g.rjust(15) for g in groups)]
        for r in self.reports:
            cells = [r.groups.get(g, {}).get("median_log10_u") for g in groups]
            lines.append(f"{r.step:>8}" + "".join(("-" if c is None else f"{c:+.2f}").rjust(15) for c in cells))
        return "\n".join(lines)
