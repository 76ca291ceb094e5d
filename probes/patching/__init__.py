"""Activation patching and attribution patching (`python -m probes.patching`).

    from probes.patching import run
    result = run(model, "When Mary and John went, John gave it to", "When Mary and John went, Mary gave it to",
                 answer=" Mary", wrong=" John", what="heads")
    result.patched  # [layer pos head], the metric with each clean head output patched into the corrupt run
    result.normalised, result.top_predictions((1, 5, 0))

`run` is loaded on first use, so that `python -m probes.patching --help` answers before torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["run", "Patching"]


def __getattr__(name: str) -> Any:
    if name == "run":
        from probes.patching.runner import run
        return run
    if name == "Patching":
        from probes.patching.result import Patching
        return Patching
    raise AttributeError(f"module 'probes.patching' has no attribute {name!r}")
