"""Causal evidence for the development view's phase changes: each change's heads ablated at the
snapshot that ends it (its evidence's `to_step`: the heads have their new role there), and the loss on
the random repeat's second half (the development's `repeat_loss`) with them and without them.

    change["ablation"] == {"snapshot": "step_000200", "step": 200, "how": "zero",
                           "repeat_loss": {"with": 1.28, "without": 3.02},
                           "each": [{"head": [1, 0], "without": 2.41}, ...]}

"with" is the snapshot's own reading (`probes.development`); "without" adds the mean change of the
second half's per-token loss that `probes.ablate` measures with the heads ablated (all together, then
each alone). A snapshot the ablation cannot run on (one saved without its code) gets None, said in
the returned lines.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from probes.errors import ProbeInputError

log = logging.getLogger("probes.development")

__all__ = ["HOWS", "ablate_changes", "repeat_ablation"]

HOWS = ("zero", "mean")


def repeat_ablation(model: Any, repeat: tuple[torch.Tensor, int], heads: list[tuple[int, int]], with_heads: float,
                    how: str = "zero") -> dict[str, Any]:
    """The repeat's second-half loss without `heads` (together, then each alone), given `with_heads`,
    the loss with them. repeat: (tokens [samples 2*length], length)."""
    from probes import ablate

    tokens, length = repeat

    def without(group: list[tuple[int, int]]) -> float:
        change = ablate.run(model, tokens, heads=group, how=how).per_token  # [samples 2*length-1]
        return with_heads + float(change[:, length:].double().mean())  # row i predicts token i+1

    return {"how": how, "repeat_loss": {"with": with_heads, "without": without(heads)},
            "each": [{"head": list(h), "without": without([h])} for h in heads] if len(heads) > 1 else []}


def ablate_changes(changes: list[dict[str, Any]], snapshots: list[dict[str, Any]], paths: list[Path],
                   repeat: tuple[torch.Tensor, int] | None, how: str = "zero") -> list[str]:
    """Add `ablation` to each phase change in place (see the module's docstring); returns what could
    not be ablated, one line each. `snapshots`: the development's readings of the snapshots at `paths`."""
    if how not in HOWS:
        raise ProbeInputError(f"the ablation is one of {', '.join(HOWS)}, got {how!r}")
    named = {p.name: p for p in paths}
    by_step = {s["step"]: (s, named[s["snapshot"]]) for s in snapshots}
    models: dict[Path, Any] = {}
    missing = []
    for change in changes:
        change["ablation"] = None
        reading, path = by_step[change["evidence"]["to_step"]]
        if repeat is None or reading.get("repeat_loss") is None:
            missing.append(f"ablation at {path.name}: no loss on the repeat to compare with")
            continue
        try:
            if path not in models:
                models[path] = loaded(path)
            found = repeat_ablation(models[path], repeat, [tuple(h) for h in change["heads"]],
                                    reading["repeat_loss"], how)
        except (ProbeInputError, ValueError) as err:
            missing.append(f"ablation at {path.name}: {str(err).splitlines()[0]}")
            continue
        change["ablation"] = {"snapshot": reading["snapshot"], "step": reading["step"], **found}
    return sorted(set(missing))


def loaded(path: Path) -> Any:
    from models.checkpoint import load_checkpoint
    from models.store.any_model import SavedModel

    model = load_checkpoint(path).model
    if isinstance(model, SavedModel):
        raise ProbeInputError("a snapshot saved without its code cannot be run with heads removed")
    return model
