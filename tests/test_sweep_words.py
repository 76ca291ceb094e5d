"""What a sweep's readers say of a diverged or failed run (issue 38, item 10): a diverged run has no
final loss in the table or the tooltip, no tooltip says "null", and a run the doctor calls failed
ends a stable range as a divergence does; the range says which verdicts it admits."""

from __future__ import annotations

import pytest

from probes import sweep as probe_sweep
from probes.sweep_parts.stats import variant_summary


def run(lr, final, verdict, diverged_at=None, init=4.0):
    return {"lr": lr, "status": "finished", "final_val_loss": final, "verdict": verdict,
            "diverged_at": diverged_at, "init_val_loss": init}


def test_a_failed_run_ends_the_stable_range_on_paper():
    # 1e-3 healthy, 1e-2 warning, 1e-1 failed (collapse, finite loss), 1 healthy: the widest stable
    # stretch is 1e-3..1e-2 (2 rates), not 1e-3..1 (4 rates) as when only divergence counted
    runs = [run(1e-3, 3.0, "healthy"), run(1e-2, 2.5, "warning"), run(1e-1, 3.5, "failed"), run(1.0, 2.8, "healthy")]
    summary = variant_summary(runs)
    assert summary["stable_range"] == {"lo": 1e-3, "hi": 1e-2, "decades": pytest.approx(1.0), "rates": 2}
    assert summary["failed"] == 1 and summary["diverged"] == 0
    # the sensitivity still counts the failed run's real loss: (3.0 + 2.5 + 3.5 + 2.8) / 4 - 2.5
    assert summary["lr_sensitivity"] == pytest.approx(11.8 / 4 - 2.5)


def test_a_diverged_run_shows_no_final_loss_in_the_table():
    diverged = run(0.3, 535.851, "failed", diverged_at=100)
    assert probe_sweep.cell_text(diverged).split() == ["-", "step", "100", "failed"]
    assert probe_sweep.cell_text(run(0.01, 2.1703, "healthy")).split() == ["2.170", "-", "healthy"]


def test_the_summary_says_which_verdicts_the_stable_range_admits(tmp_path):
    import json
    import shutil
    from pathlib import Path

    shipped = Path(__file__).resolve().parent.parent / "checkpoints" / "sweep_qk_norm" / "sweep.json"
    (tmp_path / "s").mkdir()
    shutil.copy(shipped, tmp_path / "s" / "sweep.json")
    text = probe_sweep.run(tmp_path / "s").format()
    assert "healthy or warning" in text and "failed run ends the range" in text
    rows = [line for line in text.splitlines() if line.startswith("3e-01")]
    assert rows and "5.4e+02" not in rows[0] and rows[0].split()[1] == "-", rows
    assert json.loads(shipped.read_text())["variants"][0]["failed"] == 0


def test_the_tooltip_says_diverged_and_never_null():
    from app import sweeps

    result = {"runs": [{**run(0.01, 2.5, "healthy"), "dir": "a", "variant": "v", "findings": []},
                       {**run(0.3, 535.851, "failed", diverged_at=100), "dir": "b", "variant": "v", "findings": []}]}
    frame = sweeps.points(result, {}).set_index("run")
    assert frame.loc["a", "final"] == "2.500" and frame.loc["a", "diverged"] == "no"
    assert frame.loc["b", "final"] == "none (diverged)" and frame.loc["b", "diverged"] == "step 100"
    assert frame.loc["b", "final val loss"] != frame.loc["b", "final val loss"]  # NaN: no loss drawn or told
    spec = sweeps.chart(frame.reset_index()).to_dict()
    fields = {t["field"] for layer in spec["layer"] for t in layer.get("encoding", {}).get("tooltip", [])}
    assert {"final", "diverged"} <= fields and "diverged at" not in fields and "final val loss" not in fields
