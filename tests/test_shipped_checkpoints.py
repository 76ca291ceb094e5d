"""The trained runs shipped in checkpoints/ load, learned something, and every probe runs on them."""

from pathlib import Path

import pytest
import torch

from models.checkpoint import list_snapshots, load_checkpoint, read_metrics
from probes import degenerate, entropy, logit_lens, neighbours

CHECKPOINTS = Path(__file__).resolve().parent.parent / "checkpoints"
RUNS = sorted(p for p in CHECKPOINTS.iterdir() if p.is_dir()) if CHECKPOINTS.is_dir() else []
BUDGET_BYTES = 40 * 1024 * 1024  # DESIGN.md: checkpoints/ at most 40 MB in total
TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?\n"


def test_there_are_shipped_runs_within_the_budget():
    assert RUNS, "checkpoints/ should ship at least one trained run"
    total = sum(f.stat().st_size for f in CHECKPOINTS.rglob("*") if f.is_file())
    assert total <= BUDGET_BYTES, f"checkpoints/ holds {total / 2**20:.1f} MB"


@pytest.fixture(scope="module", params=RUNS, ids=[r.name for r in RUNS])
def run(request):
    return request.param, load_checkpoint(request.param)


def test_latest_snapshot_is_the_last_step_and_weights_are_finite(run):
    run_dir, snap = run
    assert snap.path == list_snapshots(run_dir)[-1]
    assert snap.step == max(r["step"] for r in read_metrics(run_dir))
    assert snap.nonfinite_params() == []


def test_training_lowered_the_validation_loss(run):
    run_dir, _ = run
    evals = [r for r in read_metrics(run_dir) if r.get("val_loss") is not None]
    first, last = evals[0]["val_loss"], evals[-1]["val_loss"]
    # a character model starts near ln(65) = 4.17 nats; trained, it is well under 2.5
    assert first > 3.5 and last < 2.5, (first, last)


def test_model_predicts_real_text_better_than_chance(run):
    _, snap = run
    ids = torch.tensor([snap.tokenizer.encode(TEXT)])  # [1 pos]
    logits = snap.model(ids[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits[0], ids[0, 1:])
    assert loss.item() < 0.6 * torch.log(torch.tensor(float(snap.config.d_vocab))).item()


def test_every_probe_runs_on_the_shipped_run(run):
    run_dir, snap = run
    ids = torch.tensor([snap.tokenizer.encode(TEXT)])
    dims = (snap.config.n_layers, snap.config.n_heads)
    ent = entropy.run(snap.model, ids)
    assert torch.isfinite(torch.tensor(ent.entropy)).all() and torch.tensor(ent.entropy).shape == dims
    verdicts = degenerate.run(snap.model, ids).verdicts
    assert {v for row in verdicts for v in row} <= {
        "collapsed", "uniform", "sink", "self", "previous", "diverged", "healthy"}
    lens = logit_lens.run(snap.model, ids, tokenizer=snap.tokenizer)
    assert lens.kl_to_final[-1] == pytest.approx(0.0, abs=1e-6)
    near = neighbours.run(snap.model, "a", k=3, tokenizer=snap.tokenizer).to_dict()["neighbours"]
    assert len(near) == 3 and all(n["piece"] != "a" for n in near)
