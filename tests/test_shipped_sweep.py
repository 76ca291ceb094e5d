"""The learning-rate sweep shipped in checkpoints/sweep_qk_norm (its card: checkpoints/README.md):
finished, one run per rate and variant, each its history without a snapshot; its sweep.json says
what its runs' own files and the doctor say today; and the card's claims about it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from models.checkpoint import list_snapshots, read_metrics
from models.store.run import read_run_json
from probes import sweep as probe_sweep
from probes.sweep_parts.stats import lr_sensitivity, run_outcome, stable_range, unstable

SWEEP = Path(__file__).resolve().parent.parent / "checkpoints" / "sweep_qk_norm"
BOOK = json.loads((SWEEP / "sweep.json").read_text(encoding="utf-8"))
RATES = [1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0]


def variant(name: str) -> dict:
    return next(v for v in BOOK["variants"] if v["name"] == name)


def test_the_sweep_finished_one_run_per_rate_and_variant():
    assert BOOK["status"] == "finished" and BOOK["grid"]["rates"] == RATES
    assert BOOK["grid"]["preset"] == "transformer4_rms_small" and BOOK["grid"]["vary"] == {"qk_norm": ["none", "rms"]}
    assert sorted((r["lr"], r["values"]["qk_norm"]) for r in BOOK["runs"]) == sorted(
        (lr, qk) for lr in RATES for qk in ("none", "rms"))
    assert all(r["status"] == "finished" for r in BOOK["runs"])
    assert sorted(p.name for p in SWEEP.iterdir() if p.is_dir()) == sorted(["logs", *(r["dir"] for r in BOOK["runs"])])


@pytest.mark.parametrize("entry", BOOK["runs"], ids=[r["name"] for r in BOOK["runs"]])
def test_each_run_keeps_its_history_only_and_agrees_with_sweep_json(entry):
    run = SWEEP / entry["dir"]
    assert list_snapshots(run) == []  # no weights: checkpoints/ stays under its 40 MB
    info = read_run_json(run)
    assert info["model"]["qk_norm"] == entry["values"]["qk_norm"] and info["train"]["lr"] == entry["lr"]
    assert read_metrics(run)[-1]["step"] == entry["last_step"] == 600  # no run stopped on a NaN
    now = run_outcome(run)  # the files and today's doctor: a changed rule fails here (resume the sweep)
    assert {k: entry[k] for k in now} == now


def test_the_summaries_follow_from_the_runs():
    for name in ("qk_norm=none", "qk_norm=rms"):
        runs = sorted((r for r in BOOK["runs"] if r["variant"] == name), key=lambda r: r["lr"])
        diverged = [r["diverged_at"] is not None for r in runs]
        losses = [None if bad else r["final_val_loss"] for r, bad in zip(runs, diverged)]
        assert variant(name)["lr_sensitivity"] == pytest.approx(lr_sensitivity(losses, [r["init_val_loss"] for r in runs]))
        assert variant(name)["stable_range"] == stable_range([r["lr"] for r in runs], [unstable(r) for r in runs])
        assert variant(name)["failed"] == sum(r["verdict"] == "failed" and r["diverged_at"] is None for r in runs)


def test_the_cards_claims_qk_norm_does_not_widen_the_stable_range_at_this_scale():
    none, rms = variant("qk_norm=none"), variant("qk_norm=rms")
    for v in (none, rms):  # stable from 1e-3 to 1e-1, every rate from 0.3 up diverged
        assert (v["stable_range"]["lo"], v["stable_range"]["hi"]) == (1e-3, 1e-1) and v["diverged"] == 2
    assert abs(none["lr_sensitivity"] - rms["lr_sensitivity"]) < 0.05
    attn_peak = {qk: max(v for r in read_metrics(SWEEP / f"lr=3e-01,qk_norm={qk}") if r.get("attn_logit_max")
                         for heads in r["attn_logit_max"].values() for v in heads if v is not None)
                 for qk in ("none", "rms")}
    assert attn_peak["none"] > 1e4 and attn_peak["rms"] < 30  # QK-norm holds the scores; the loss still blows up


def test_probes_sweep_prints_the_shipped_table(capsys):
    assert probe_sweep.main(["--ckpt", str(SWEEP)]) == 0
    text = capsys.readouterr().out
    assert "14 of 14 runs finished; sweep finished" in text and "1e-03..1e-01 (2.0 decades)" in text
