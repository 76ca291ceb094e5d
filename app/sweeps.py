"""The learning-rate sweeps the app knows (folders holding a `python -m train.sweep` sweep.json),
read through `probes.sweep` (cached on sweep.json's modification time) and shaped for the Sweep
page's chart. Every number comes from sweep.json: nothing here recomputes a loss or a sensitivity.

A sweep is found where a run would be: a run root that is a sweep, or a folder right under a run
root that is one (`-- --runs sweeps/` lists every sweep in it). Its runs are ordinary runs, listed
in the sidebar like any other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from models.store.run import list_snapshots
from probes import sweep as probe_sweep
from probes.sweep_parts.stats import SWEEP_FILE

__all__ = ["CLICK", "chart", "clicked", "discover", "label_of", "list_row", "overview_row", "points", "read", "run_rows",
           "verdict_counts"]

SHAPES = {"healthy": "circle", "warning": "triangle-up", "failed": "square", "diverged": "cross"}
CLICK = "open"  # the point selection: a click on a point opens that run
STACK = 0.05  # diverged runs above the edge: one row per variant, this fraction of the loss range apart


def discover(roots: list[Path]) -> list[Path]:
    """Sweep folders at or right under the run roots, each once."""
    found: dict[Path, Path] = {}
    for root in roots:
        children = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
        for folder in [root, *children]:
            if (folder / SWEEP_FILE).is_file():
                found.setdefault(folder.resolve(), folder)
    return list(found.values())


def label_of(folder: Path, sweeps: list[Path]) -> str:
    """The folder's name; with its parent in brackets when two sweeps share the name."""
    same = [s for s in sweeps if s.name == folder.name]
    return folder.name if len(same) < 2 else f"{folder.name} ({folder.parent.name})"


def read(folder: Path) -> dict[str, Any]:
    """probes.sweep's result (`--json`'s dict) for a sweep folder, cached until sweep.json changes."""
    path = folder / SWEEP_FILE
    return _read(str(folder), path.stat().st_mtime if path.is_file() else 0.0)


@st.cache_data(max_entries=32, show_spinner=False)
def _read(folder: str, stamp: float) -> dict[str, Any]:
    return probe_sweep.run(folder).to_dict()


def overview_row(result: dict[str, Any]) -> dict[str, Any]:
    """The landing view's row of a sweep: model, grid, progress and each variant's LR sensitivity."""
    grid, runs = result["grid"], result["runs"]
    sens = "; ".join(f"{v['name']} {v['lr_sensitivity']:.3f}" if v.get("lr_sensitivity") is not None
                     else f"{v['name']} -" for v in result.get("variants", []))
    return {"model": grid["preset"], "rates": len(grid["rates"]), "variants": len(result.get("variants", [])),
            "finished": f"{sum(r['status'] == 'finished' for r in runs)} of {len(runs)}",
            "status": result.get("status", "?"), "LR sensitivity": sens}


VERDICTS = ("failed", "warning", "healthy", "too short")  # worst first


def verdict_counts(result: dict[str, Any]) -> str:
    """The doctor's verdicts of a sweep's finished runs, worst first: `4 failed, 4 warning, 6 healthy`."""
    verdicts = [r.get("verdict") for r in result["runs"] if r["status"] == "finished" and r.get("verdict")]
    return ", ".join(f"{verdicts.count(v)} {v}" for v in VERDICTS if verdicts.count(v))


def list_row(result: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The run list's one row for a whole sweep (its runs fold under it): the columns of a run's row
    from sweep.json alone (each run's verdict is there already: no doctor runs for them), in words
    short enough for the run list's columns at 1280 px: state `4/14 diverged` (`9/14 done` while it
    runs), doctor the worst verdict's count (`4 failed`; every count is on the Sweeps section's fold)."""
    runs = result["runs"]
    finished = [r for r in runs if r["status"] == "finished"]
    diverged = sum(r.get("diverged_at") is not None for r in finished)
    finals = [r["final_val_loss"] for r in finished
              if r.get("diverged_at") is None and isinstance(r.get("final_val_loss"), (int, float))]
    counts = verdict_counts(result)
    steps = [r["last_step"] for r in runs if isinstance(r.get("last_step"), int)]
    snapshots = sum(len(list_snapshots(folder / r["dir"])) for r in runs if (folder / r["dir"]).is_dir())
    return {"model": f"sweep of {result['grid']['preset']}", "steps": max(steps) if steps else None,
            "snapshots": snapshots, "last val loss": f"best {min(finals):.3f}" if finals else "-",
            "state": f"{diverged}/{len(runs)} diverged" if diverged and len(finished) == len(runs)
                     else f"{len(finished)}/{len(runs)} done",
            "doctor": counts.split(", ")[0] if counts else "-"}


def run_rows(result: dict[str, Any], labels: dict[str, str]) -> list[dict[str, Any]]:
    """One row per run of the sweep, from sweep.json: rate, variant, status, final val loss (none
    for a diverged run), divergence step, the doctor's verdict and findings, and its app label."""
    return [{"lr": probe_sweep.rate_text(r["lr"]), "variant": r["variant"], "status": r["status"],
             "final val loss": None if r.get("diverged_at") is not None else r.get("final_val_loss"),
             "diverged at": r.get("diverged_at"), "verdict": r.get("verdict") or "-",
             "findings": ", ".join(r.get("findings") or []), "run": labels.get(r["dir"], r["dir"])}
            for r in result["runs"]]


def points(result: dict[str, Any], labels: dict[str, str]) -> pd.DataFrame:
    """One row per finished run: rate, variant, final val loss, divergence step, verdict, and the
    height it is drawn at. A diverged run has no final loss: it is drawn at the chart's top edge
    (`clipped`), never at a made-up loss. `labels` maps a run's folder name to its app label."""
    rows = []
    for run in result["runs"]:
        if run["status"] != "finished":
            continue
        diverged = run.get("diverged_at") is not None
        final = None if diverged else run.get("final_val_loss")  # as the chart says: a diverged run has none
        rows.append({"run": labels.get(run["dir"], run["dir"]), "lr": run["lr"], "variant": run["variant"],
                     "final val loss": final, "diverged at": run.get("diverged_at"),
                     "final": "none (diverged)" if diverged else "-" if final is None else f"{final:.3f}",
                     "diverged": f"step {run['diverged_at']}" if diverged else "no",  # the tooltip's words
                     "verdict": run.get("verdict") or "-", "findings": ", ".join(run.get("findings") or []),
                     "point": "diverged" if diverged or final is None else (run.get("verdict") or "healthy")})
    frame = pd.DataFrame(rows, columns=["run", "lr", "variant", "final val loss", "diverged at", "final", "diverged",
                                        "verdict", "findings", "point"])
    finals = [v for v, p in zip(frame["final val loss"], frame["point"]) if p != "diverged"]
    low, high = (min(finals), max(finals)) if finals else (0.0, 1.0)
    step = max(high - low, 0.1) * STACK
    order = {v: i for i, v in enumerate(dict.fromkeys(frame["variant"]))}
    frame["y"] = [edge_of(low, high) + (order[v] + 1) * step if p == "diverged" else y
                  for y, p, v in zip(frame["final val loss"], frame["point"], frame["variant"])]
    frame["clipped"] = frame["point"] == "diverged"
    return frame


def edge_of(low: float, high: float) -> float:
    """The dashed line above the highest final loss: diverged runs are drawn above it."""
    return high + max(high - low, 0.1) * 0.1


def ticks(low: float, high: float) -> list[float]:
    """Round tick values from `low` to `high`, about five of them."""
    span = max(high - low, 1e-9)
    step = next(s * 10.0 ** e for e in range(-3, 4) for s in (1, 2, 5) if s * 10.0 ** e >= span / 6)
    first = -(-low // step) * step
    values = [round(first + i * step, 6) for i in range(int((high - first) / step + 1e-9) + 1)]
    return [v for v in values if low <= v <= high] or [round(low, 3)]


def chart(frame: pd.DataFrame) -> alt.LayerChart:
    """Final val loss against learning rate (log x), a line per variant through its finite losses;
    a point per run shaped by the doctor's verdict, diverged runs as crosses on the top edge. A
    click on a point selects it (the page opens that run)."""
    finite = frame[~frame["clipped"]]
    low = float(finite["y"].min()) if len(finite) else 0.0
    high = float(finite["y"].max()) if len(finite) else 1.0
    pad = max(high - low, 0.1) * STACK
    top = max(float(frame["y"].max()), edge_of(low, high)) + pad
    x = alt.X("lr:Q", scale=alt.Scale(type="log"), axis=alt.Axis(format=".0e", title="learning rate (log)"))
    y = alt.Y("y:Q", scale=alt.Scale(domain=[low - pad, top], nice=False), title="final val loss (nats)",
              axis=alt.Axis(values=ticks(low - pad, edge_of(low, high))))  # no loss is claimed above the edge
    colour = alt.Color("variant:N", title="variant", legend=alt.Legend(labelLimit=320))
    pick = alt.selection_point(name=CLICK, fields=["run"], on="click", clear=False)
    lines = alt.Chart(finite).mark_line().encode(x=x, y=y, color=colour, detail="variant:N")
    shape = alt.Shape("point:N", title="doctor / outcome",
                      scale=alt.Scale(domain=list(SHAPES), range=list(SHAPES.values())))
    tooltip = ["run", alt.Tooltip("lr:Q", format=".1e"), "variant", alt.Tooltip("final:N", title="final val loss"),
               alt.Tooltip("diverged:N", title="diverged at"), "verdict", "findings"]
    dots = alt.Chart(frame).mark_point(filled=True, size=110).encode(
        x=x, y=y, color=colour, shape=shape, tooltip=tooltip).add_params(pick)
    edge = alt.Chart(pd.DataFrame({"y": [edge_of(low, high)]})).mark_rule(strokeDash=[4, 4], color="#999").encode(y="y:Q")
    return alt.layer(lines, dots, edge).properties(
        width=640, height=340, title=alt.TitleParams(
            "Final val loss against learning rate", subtitle="+ above the dashed line: diverged, no final loss (one row "
                                                             "per variant); click a point to open its run"))


def clicked(event: Any) -> str | None:
    """The run a click on the chart picked, or None."""
    try:
        chosen = event["selection"][CLICK]
    except (KeyError, TypeError):
        return None
    return chosen[0].get("run") if chosen else None
