"""The numbers the probes judge by, torch-free so that the CLIs can show them in `--help` before
importing torch: degenerate attention's verdict thresholds, its training-timeline fractions and
the activation probe's tanh saturation."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

SATURATION = 0.97  # makemore: |tanh| above this is in the flat tail
TIMELINE_COLLAPSE = 0.1  # logged entropy below this fraction of uniform (ln k) is collapsed
TIMELINE_UNIFORM = 0.97  # ... above this fraction of uniform is uniform


@dataclass(frozen=True)
class Thresholds:
    """When a head earns each verdict. All are fractions in [0, 1].

    collapse_entropy=0.1, collapse_max_prob=0.9: one-hot. A head whose rows keep 90% of their mass
    on one key, or whose entropy is a tenth of uniform, passes almost nothing but one token; the
    series' collapsed head logged 0.003 nats, far below either.
    uniform_entropy=0.97: rows within 3% of the uniform entropy ln(k) (score spread of about 0.4
    at k=16); such a head averages its context, the state of every head at a small-std init.
    sink_mass=0.5: "most mass on the first position" (DESIGN.md), the attention-sink pattern.
    one_hot_mass=0.9: `self` / `previous` need 90% of each row's mass on the diagonal / previous
    token, the same bar as collapse_max_prob.
    sink_score=0.3: the attention-sink literature's epsilon (Gu et al. 2024, "When Attention Sink
    Emerges"): a head is a sink head when its mean attention to the first token exceeds 0.3. It is
    reported as evidence (`sink_score`, `sink_rate`), not used for the verdict.
    """

    collapse_entropy: float = 0.1
    collapse_max_prob: float = 0.9
    uniform_entropy: float = 0.97
    sink_mass: float = 0.5
    one_hot_mass: float = 0.9
    sink_score: float = 0.3

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ValueError(f"threshold {f.name} must be in [0, 1], got {value!r}")
