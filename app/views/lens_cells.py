"""The logit lens's grid as rows, shared by the Logit lens page and the tuned lens drawn on it
(`app.views.lens`, `app.views.tuned`): below both, so that each imports it one way."""

from __future__ import annotations

import json
import math

import pandas as pd

from app import charts, data

NOT_FINITE = "(NaN)"  # the probe's mark for a position without a top token


def lens_cells(result: dict) -> pd.DataFrame:
    """One row per layer and position: the top-1 token (NOT_FINITE where the layer's top-k is empty or
    its probabilities are NaN: the probe gives either), its probability, KL and rank, the top-k."""
    pieces = result["pieces"][0]
    rows = []
    for l, label in enumerate(result["layers"]):
        for pos, top in enumerate(result["top_k"][l][0]):
            top = [t for t in top if _finite(t["prob"])]  # NaN probabilities rank nothing
            best = top[0] if top else {"piece": NOT_FINITE, "id": None, "prob": None}
            rows.append({"layer": label, "label": f"{pos}: {data.shown(pieces[pos])}",
                         "top-1": data.shown(best["piece"] or str(best["id"])),
                         "top-1 probability": best["prob"],
                         "KL to final (nats)": result["kl_to_final_per_position"][l][0][pos],
                         "rank of the true next token": result["target_rank_per_position"][l][0][pos],
                         "last": pos == len(pieces) - 1,
                         "top-k": json.dumps([(t["piece"], round(t["prob"], 3)) for t in top],
                                             ensure_ascii=False)})
    return pd.DataFrame(rows)


def with_nan(cells: pd.DataFrame, measure: str) -> pd.DataFrame:
    """`cells` with the charts' NaN column: "NaN" where `measure` is missing because a distribution
    is not finite (the last position has no next token to rank: blank there, not NaN)."""
    undefined = cells["last"] & (measure == "rank of the true next token")
    return cells.assign(**{charts.NAN: ["NaN" if v else "" for v in cells[measure].isna() & ~undefined]})


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
