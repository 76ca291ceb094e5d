"""What the run doctor says about a run: findings, ranked; each rule says what it found, or why it
could not look. Torch-free (see `probes.diagnose`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["Finding", "NotChecked", "SEVERITIES", "rank_key", "rule"]

SEVERITIES = ("info", "warning", "failed")  # ascending; the verdict is healthy / warning / failed

# References, named once: the series' parts, makemore, and the papers behind the rules.
SERIES_ATTENTION = "the series, single-head attention: entropy 0.003, fixed by 1/sqrt(d) scaling"
SERIES_RMSNORM = "the series, transformers: four blocks went NaN until RMSNorm"
SERIES_ADAM = "the series, SGD then Adam: Q/K moved ~10x slower than the MLP under SGD"
MAKEMORE_INIT = "makemore part 3 (Karpathy): the initial loss should be about ln(vocab)"
MAKEMORE_ACTIVATIONS = "makemore part 3 (Karpathy): dead and saturated units, activation statistics"
MAKEMORE_UPDATES = "makemore part 3 (Karpathy): update:data ratio, log10 around -3"
MAKEMORE_SPLITS = "makemore part 2 (Karpathy): train/dev splits, overfitting and the best checkpoint"
ZHAI = "Zhai et al. 2023, Stabilizing Transformer Training by Preventing Attention Entropy Collapse"
WORTSMAN = "Wortsman et al. 2023, Small-scale proxies for large-scale Transformer training instabilities"
PASCANU = "Pascanu et al. 2013, On the difficulty of training recurrent neural networks (clipping)"


@dataclass(frozen=True)
class Finding:
    """One thing the doctor found: what (`code`, `title`), how bad, from which step, where, the
    numbers behind it, why it happens, what to change and who says so."""

    code: str
    severity: str
    title: str  # one line: what went wrong, where
    step: int | None  # the logged step it starts at
    cause: str
    fix: str  # what to change; "" for a note that needs no change (left out of "what to try")
    reference: str
    where: tuple[str, ...] = ()
    evidence: dict[str, Any] = field(default_factory=dict)  # named numbers (and short labels)
    warning_step: int | None = None  # the first step a warning could have been given
    page: str = "overview"  # the app page that shows the evidence

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {self.severity!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "severity": self.severity, "title": self.title, "step": self.step,
                "warning_step": self.warning_step, "where": list(self.where),
                "evidence": {k: _jsonable(v) for k, v in self.evidence.items()},
                "cause": self.cause, "fix": self.fix, "reference": self.reference, "page": self.page}

    def evidence_text(self) -> str:
        return ", ".join(f"{name} {_show(value)}" for name, value in self.evidence.items())


class NotChecked(Exception):
    """A rule could not look: the key it reads was not logged, or there is too little history."""


Rule = Callable[..., list[Finding]]


def rule(*codes: str) -> Callable[[Rule], Rule]:
    """Mark a rule function with the finding codes it can give (listed when it cannot look)."""
    def mark(fn: Rule) -> Rule:
        fn.codes = codes  # type: ignore[attr-defined]
        return fn
    return mark


def rank_key(finding: Finding) -> tuple[int, float]:
    """Severity first (failed before warning before info), then the step it starts at."""
    step = math.inf if finding.step is None else finding.step
    return (-SEVERITIES.index(finding.severity), step)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _show(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, float):
        return str(value)
    if not math.isfinite(value):
        return "nan"
    return f"{value:.3g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.2e}"
