"""Causal evidence for the development view's phase changes: each change's heads ablated at the
snapshot that ends it (its evidence's `to_step`: the heads have their new role there), and the loss on
the random repeat's second half (the development's `repeat_loss`) with them and without them.

    change["ablation"] == {"snapshot": "step_000200", "step": 200, "how": "zero",
                           "repeat_loss": {"with": 1.28, "without": 3.02},
                           "each": [{"head": [1, 0], "without": 2.41}, ...]}

"with" is the snapshot's own reading (`probes.development`); "without" adds the mean change of the
second half's per-token loss that `probes.ablate` measures with the heads ablated (all together, then
each alone). A snapshot the ablation cannot run on (one saved without its code) gets None, said in
the returned lines. `confirm_induction` ablates each head that scores as an induction head, alone
(`python -m probes.heads --repeat --confirm`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from probes.errors import ProbeInputError

log = logging.getLogger("probes.development")

__all__ = ["HOWS", "ablate_changes", "confirm_induction", "repeat_ablation", "repeat_loss_change"]

HOWS = ("zero", "mean")
CONFIRM_SCORE = 0.3  # an induction score (Olsson's) from which `confirm_induction` ablates the head
CONFIRM_RISE = 0.1  # nats the repeat's second-half loss must rise without it for the score to be confirmed


def repeat_loss_change(model: Any, repeat: tuple[torch.Tensor, int], heads: list[tuple[int, int]],
                       how: str = "zero") -> float:
    """How much the loss on the repeat's second half rises with `heads` ablated together (`probes.ablate`).
    repeat: (tokens [samples 2*length], length)."""
    from probes import ablate

    tokens, length = repeat
    change = ablate.run(model, tokens, heads=heads, how=how).per_token  # [samples 2*length-1]
    return float(change[:, length:].double().mean())  # row i predicts token i+1: the copy's, first left out


def repeat_ablation(model: Any, repeat: tuple[torch.Tensor, int], heads: list[tuple[int, int]], with_heads: float,
                    how: str = "zero") -> dict[str, Any]:
    """The repeat's second-half loss without `heads` (together, then each alone), given `with_heads`,
    the loss with them. repeat: (tokens [samples 2*length], length)."""
    def without(group: list[tuple[int, int]]) -> float:
        return with_heads + repeat_loss_change(model, repeat, group, how)

    return {"how": how, "repeat_loss": {"with": with_heads, "without": without(heads)},
            "each": [{"head": list(h), "without": without([h])} for h in heads] if len(heads) > 1 else []}


def confirm_induction(model: Any, repeat: tuple[torch.Tensor, int], scores: list[list[float]],
                      at_least: float = CONFIRM_SCORE) -> list[dict[str, Any]]:
    """Each head whose Olsson induction score on the repeat (`scores` [layer][head]) is at least
    `at_least`, zero-ablated alone: the rise of the repeat's second-half loss, and whether it is at
    least CONFIRM_RISE nats (the head does what its score says), for `probes.heads --confirm`."""
    found = []
    for layer, row in enumerate(scores):
        for head, score in enumerate(row):
            if score is not None and score >= at_least:
                rise = repeat_loss_change(model, repeat, [(layer, head)])
                found.append({"head": [layer, head], "induction_repeat": score, "loss_rise": rise,
                              "confirmed": rise >= CONFIRM_RISE})
    return found


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
