"""The runs shipped in checkpoints/ load, and the probes still read each one as its model card
(checkpoints/README.md) says: a later change that breaks the series' story fails here."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
import torch

from models.checkpoint import list_snapshots, load_checkpoint, read_metrics
from models.store.run import read_run_json
from probes import activations, degenerate, entropy, logit_lens, neighbours, updates
from probes.doctor.thresholds import DoctorThresholds

CHECKPOINTS = Path(__file__).resolve().parent.parent / "checkpoints"
FOLDERS = sorted(p for p in CHECKPOINTS.iterdir() if p.is_dir()) if CHECKPOINTS.is_dir() else []
RUNS = [p for p in FOLDERS if not (p / "sweep.json").exists()]  # the sweep: tests/test_shipped_sweep.py
BUDGET_BYTES = 45 * 1000 * 1000  # DESIGN.md: checkpoints/ at most 45 MB
TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n"
STORY = ["attn1_noscale", "attn1_residual", "mha4", "transformer4_nan", "shakespeare_rms4",
         "shakespeare_rms4_adam", "shakespeare_gpt", "char_mlp", "induction"]
INDUCTION = CHECKPOINTS / "induction"  # not Shakespeare: in-context repetition (train.repetition)
SHAKESPEARE = [r for r in RUNS if r != INDUCTION]
DIVERGED = {"transformer4_nan"}


def tokens_of(snap) -> torch.Tensor:
    """[1 pos]: TEXT, or for the induction run (32 characters, no Shakespeare) a window of its own data."""
    if snap.config.d_vocab == 32:
        return torch.tensor([snap.tokenizer.encode((INDUCTION / "data.txt").read_text()[:snap.config.n_ctx])])
    return torch.tensor([snap.tokenizer.encode(TEXT)])


@pytest.fixture(scope="module")
def snaps() -> dict:
    return {run.name: load_checkpoint(run) for run in RUNS}


def test_every_run_of_the_story_is_shipped_within_the_budget():
    assert [r.name for r in RUNS] == sorted(STORY)
    assert [p.name for p in FOLDERS if p not in RUNS] == ["sweep_qk_norm"]
    total = sum(f.stat().st_size for f in CHECKPOINTS.rglob("*") if f.is_file())
    assert total <= BUDGET_BYTES, f"checkpoints/ holds {total / 2**20:.1f} MB"
    assert not list(CHECKPOINTS.rglob(".train.lock")), "a training lock shipped in checkpoints/"
    cards = (CHECKPOINTS / "README.md").read_text(encoding="utf-8")
    for name in STORY:
        assert f"### `{name}`" in cards, f"no model card for {name}"


@pytest.mark.parametrize("run", SHAKESPEARE, ids=[r.name for r in SHAKESPEARE])
def test_run_format_latest_snapshot_and_command(run):
    meta = read_run_json(run)
    assert meta["command"].startswith("python -m train --preset ")
    assert meta["tokenizer"] == {"kind": "char", "vocab_size": 65}
    records = read_metrics(run)
    snap = load_checkpoint(run)
    assert snap.path == list_snapshots(run)[-1]
    assert snap.step == max(r["step"] for r in records)
    for path in list_snapshots(run):
        assert not (path / "optimizer.pt").exists()  # kept out to fit the budget
        assert json.loads((path / "config.json").read_text())["model"] == meta["model"]


def first_and_last_val_loss(run: Path) -> tuple[float, float]:
    evals = [r["val_loss"] for r in read_metrics(run) if r.get("val_loss") is not None]
    return evals[0], evals[-1]


@pytest.mark.parametrize("run", [r for r in SHAKESPEARE if r.name not in DIVERGED], ids=lambda r: r.name)
def test_healthy_runs_learned_and_predict_real_text(run, snaps):
    first, last = first_and_last_val_loss(run)
    assert first > 3.5, first  # ln(65) = 4.17 at the start
    if run.name != "attn1_noscale":  # its head is one-hot: only the MLP learns (test_run1 below)
        assert last < 2.75, (first, last)
    snap = snaps[run.name]
    assert snap.nonfinite_params() == []
    ids = tokens_of(snap)[:, : snap.config.n_ctx + 1]  # [1 n_ctx+1]: one window
    logits = snap.model(ids[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits[0], ids[0, -logits.shape[1]:])
    assert loss.item() < 0.7 * math.log(snap.config.d_vocab)


def test_run1_single_head_without_scaling_collapses(snaps):
    snap = snaps["attn1_noscale"]
    result = degenerate.run(snap.model, tokens_of(snap))
    assert result.verdicts == [["collapsed"]]
    timeline = degenerate.entropy_timeline(read_metrics(CHECKPOINTS / "attn1_noscale"), snap.config.n_ctx)
    assert timeline.collapsed == [[0]]  # one-hot from initialisation on
    assert entropy.run(snap.model, tokens_of(snap)).entropy[0][0] < 0.01  # the series: 0.003
    first, last = first_and_last_val_loss(CHECKPOINTS / "attn1_noscale")
    fixed = first_and_last_val_loss(CHECKPOINTS / "attn1_residual")[1]
    assert first - last > 1.0 and last > fixed + 0.5  # the MLP learns; far less than with the fixes


def test_run2_scaling_and_residuals_keep_the_head_alive(snaps):
    snap = snaps["attn1_residual"]
    result = degenerate.run(snap.model, tokens_of(snap))
    assert result.verdicts[0][0] != "collapsed"
    assert 0.3 < entropy.run(snap.model, tokens_of(snap)).entropy[0][0] < 2.5  # the series: ~1.16


def test_run3_four_heads_specialise(snaps):
    snap = snaps["mha4"]
    heads = entropy.run(snap.model, tokens_of(snap)).entropy_normalized[0]
    assert len(heads) == 4 and max(heads) - min(heads) > 0.3  # from near-uniform to focused


def test_run4_without_a_norm_goes_nan_and_keeps_that_moment():
    records = read_metrics(CHECKPOINTS / "transformer4_nan")
    last = records[-1]
    assert last.get("diverged") and last["step"] < 50
    assert any(h is None for heads in last["attn_entropy"].values() for h in heads)
    assert list_snapshots(CHECKPOINTS / "transformer4_nan")[-1].name == f"step_{last['step']:06d}"
    assert all(r.get("diverged") is None for r in records[:-1])  # it stopped at the first


def test_run4_probes_report_the_divergence_without_crashing(snaps):
    snap = snaps["transformer4_nan"]
    verdicts = degenerate.run(snap.model, tokens_of(snap)).verdicts
    assert "diverged" in {v for row in verdicts for v in row}
    health = activations.run(snap.model, tokens_of(snap), grads=False)
    assert health.warnings()  # NaN activations are named, not counted as dead units


def block0_gap(report: updates.UpdateReport) -> float:
    """Orders of magnitude between block 0's MLP and its attention Q/K (median log10 u)."""
    def median(group: str) -> float:
        return statistics.median(row["log10_u"] for name, row in report.parameters.items()
                                 if name.startswith("blocks.0.") and report.group_of[name] == group)
    return median("MLP") - median("attention Q/K")


def test_run5_sgd_moves_first_layer_qk_slower_and_run6_adam_closes_it():
    history = updates.from_run(CHECKPOINTS / "shakespeare_rms4")
    sgd, adam = history.latest, updates.from_run(CHECKPOINTS / "shakespeare_rms4_adam").latest
    late = [block0_gap(history.at(s)) for s in history.steps if s >= history.latest.step / 2]
    assert statistics.median(late) >= DoctorThresholds().slow_qk_orders  # the doctor's "slow": 0.75 orders
    assert block0_gap(adam) < block0_gap(sgd) - 0.5
    assert adam.spread < sgd.spread - 0.3


def test_char_mlp_activation_health_shows_a_sparse_relu_layer(snaps):
    snap = snaps["char_mlp"]
    ids = torch.tensor([snap.tokenizer.encode(TEXT * 3)])
    layer = activations.run(snap.model, ids).layers[0]
    assert layer["saturated_fraction"] > 0.7  # most ReLU outputs are exactly 0 after training
    start = read_metrics(CHECKPOINTS / "char_mlp")[0]["activations"]["mlp.hook_post"]
    assert start["saturated"] < 0.6  # about half at initialisation


@pytest.mark.parametrize("run", [r for r in RUNS if r.name not in DIVERGED], ids=lambda r: r.name)
def test_every_probe_runs_on_the_shipped_run(run, snaps):
    snap = snaps[run.name]
    ids = tokens_of(snap)
    if getattr(snap.config, "unembed", "mlp") != "mlp":  # no residual stream to decode otherwise
        lens = logit_lens.run(snap.model, ids, tokenizer=snap.tokenizer)
        assert lens.kl_to_final[-1] == pytest.approx(0.0, abs=1e-6)
    near = neighbours.run(snap.model, "a", k=3, tokenizer=snap.tokenizer).to_dict()["neighbours"]
    assert len(near) == 3 and all(n["piece"] != "a" for n in near)
    assert updates.from_run(run).latest.step == snap.step
    if snap.config.family == "transformer":
        ent = torch.tensor(entropy.run(snap.model, ids).entropy)
        assert torch.isfinite(ent).all() and ent.shape == (snap.config.n_layers, snap.config.n_heads)


def test_the_induction_run_forms_induction_heads_in_layer_1():
    """checkpoints/induction (its card): `python -m train.repetition`'s run, written by the Monitor; the
    held-out loss on the repeated part falls from ln 32 to under 0.5 nats, and Olsson et al.'s induction
    score on a random repeat rises from chance in every head to > 0.5 in a head of layer 1 only."""
    from probes import heads

    meta = read_run_json(INDUCTION)
    assert meta["command"].startswith("python -m train.repetition --out checkpoints/induction ")
    assert meta["tokenizer"] == {"kind": "char", "vocab_size": 32} and meta["source"] == "monitor"
    snapshots = list_snapshots(INDUCTION)
    assert not any((p / "optimizer.pt").exists() for p in snapshots) and len(snapshots) >= 15
    first, last = first_and_last_val_loss(INDUCTION)
    assert first > 0.95 * math.log(32) and last < 0.5
    repeat = heads.random_repeat_tokens(32, 16, 8, seed=0)  # [8 32]: 16 random tokens, twice
    scores = {}
    for path in (snapshots[0], snapshots[-1]):
        snap = load_checkpoint(path)
        assert snap.step == max(r["step"] for r in read_metrics(INDUCTION)) or path == snapshots[0]
        scores[path] = torch.tensor(heads.run(snap.model, repeat, repeat_period=16).induction_repeat)  # [layer head]
    assert scores[snapshots[0]].max() < 0.2
    after = scores[snapshots[-1]]
    assert after[1].max() > 0.5 and after[0].max() < 0.5 * after[1].max()
    # the score is causal: ablated alone, an induction head of layer 1 costs the repeat's second half loss
    from probes.development_parts.phase_ablation import CONFIRM_RISE, confirm_induction
    found = confirm_induction(snap.model, (repeat, 16), after.tolist())
    assert {tuple(c["head"]) for c in found} == {(1, h) for h in range(4) if after[1, h] >= 0.3}
    assert max(c["loss_rise"] for c in found) > CONFIRM_RISE
