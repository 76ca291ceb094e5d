"""The tour notebook runs top to bottom (so it never rots) and shows what the probes compute.

Executed with nbclient in a fresh kernel from `notebooks/`, as a user opening it would; outputs
are never committed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parent.parent
TOUR = ROOT / "notebooks" / "tour.ipynb"
PROBES = ("entropy.run", "degenerate.run", "entropy.head_pattern", "neighbours.run", "projection.run",
          "logit_lens.run", "updates.from_run", "activations.run", "diagnose.run", "run_with_cache",
          "heads.run_repeat", "attribution.run", "development.run", "patching.run", "ablate.run")


def code_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code"]


def test_tour_is_committed_without_outputs_and_visits_every_probe():
    nb = nbformat.read(TOUR, as_version=4)
    source = "\n".join(c.source for c in code_cells(nb))
    assert all(not c.outputs and c.execution_count is None for c in code_cells(nb))
    assert [p for p in PROBES if p not in source] == []


def printed(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def charts(cell) -> list[str]:
    return [o["data"]["text/html"] for o in cell.outputs
            if o.output_type == "execute_result" and "text/html" in o.get("data", {})]


@pytest.fixture(scope="module")
def executed():
    nb = nbformat.read(TOUR, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=240, kernel_name="python3",
                                     resources={"metadata": {"path": str(TOUR.parent)}})
    client.execute()  # raises CellExecutionError naming the cell on any error
    return nb


@pytest.mark.slow
def test_tour_runs_and_plots(executed):
    cells = code_cells(executed)
    assert all(not any(o.output_type == "error" for o in c.outputs) for c in cells)
    plotted = [c for c in cells if charts(c)]
    assert len(plotted) >= 5  # entropy grid, head heatmap, PCA map, lens KL, g/w/u lines
    assert all("vega" in html for c in plotted for html in charts(c))


@pytest.mark.slow
def test_tour_prints_what_the_probes_compute(executed):
    from models.checkpoint import load_checkpoint
    from probes import degenerate, entropy
    cells = code_cells(executed)
    entropy_cell = next(c for c in cells if "ent = entropy.run" in c.source)
    text_cell = next(c for c in cells if c.source.lstrip().startswith("snap = load_checkpoint"))
    text = ast.literal_eval(next(line.split("=", 1)[1].split("#")[0].strip()
                                 for line in text_cell.source.splitlines() if line.startswith("text =")))
    snap = load_checkpoint(ROOT / "checkpoints" / "shakespeare_rms4")
    expected = entropy.run(snap.model, snap.encode(text)).series_display()  # ids, as a tensor
    assert printed(entropy_cell).splitlines()[0] == expected
    verdict_cell = next(c for c in cells if "degenerate.run" in c.source and "attn1_noscale" in c.source)
    lines = printed(verdict_cell).splitlines()
    assert lines[0].startswith("attn1_noscale") and "collapsed" in lines[0]
    noscale = load_checkpoint(ROOT / "checkpoints" / "attn1_noscale")
    assert degenerate.run(noscale.model, noscale.encode(text)).verdicts == [["collapsed"]]
    doctor_cell = next(c for c in cells if "diagnose.run" in c.source)
    doctor = printed(doctor_cell).splitlines()
    assert doctor[0] == "attn1_noscale: failed" and "attention_collapse" in doctor[1]
    assert "transformer4_nan: failed" in doctor
    patch_cell = next(c for c in cells if "patching.run" in c.source)
    patched = printed(patch_cell)
    assert patched.startswith("exact patching (denoise) of heads") and "zero ablation" in patched
