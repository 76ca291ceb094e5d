"""The run doctor's eval metrics: attn_logit_max, resid_rms, logit_max in metrics.jsonl, each
checked against a reference computed by hand from `run_with_cache` on the logged snapshot."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from models import build_model, get_preset
from models.checkpoint import list_snapshots, load_checkpoint, read_metrics
from models.loss import block_len
from probes.entropy import series_entropy
from test_train import tiny_text
from train import data
from train.data import eval_batch_stats, load_corpus, sample_blocks
from train.loop import main

DOCTOR_KEYS = {"attn_logit_max", "resid_rms", "logit_max"}
SEED, BATCH, EVAL_BATCHES = 0, 8, 2


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "tiny.txt"
    path.write_text(tiny_text(), encoding="utf-8")
    return path


def train(text_file: Path, out: Path, preset: str, *extra: str) -> int:
    return main(["--data", str(text_file), "--out", str(out), "-q", "--preset", preset,
                 "--batch-size", str(BATCH), "--eval-batches", str(EVAL_BATCHES), "--seed", str(SEED),
                 *extra])


@pytest.fixture(scope="module")
def rms_run(text_file, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "rms4"
    assert train(text_file, out, "transformer4_rms_small", "--steps", "6", "--log-every", "2",
                 "--eval-every", "3", "--save-every", "3") == 0
    return out


def first_val_batch(text_file: Path, snap) -> torch.Tensor:
    """The batch evaluate() measured on: the first --batch-size of the run's fixed val blocks."""
    corpus = load_corpus(text_file, "char", 0.1, tokenizer=snap.tokenizer)
    gen = torch.Generator().manual_seed(SEED)
    blocks = sample_blocks(corpus.val, EVAL_BATCHES * BATCH, block_len(snap.model.cfg), gen)
    return blocks[:BATCH]  # [batch block_len]


def test_eval_records_carry_the_doctor_keys_with_layers_by_heads(rms_run):
    cfg = get_preset("transformer4_rms_small")
    layers = [str(i) for i in range(cfg.n_layers)]
    evals = [r for r in read_metrics(rms_run) if "val_loss" in r]
    assert [r["step"] for r in evals] == [0, 3, 6]
    for r in evals:
        assert DOCTOR_KEYS <= set(r)
        assert list(r["attn_logit_max"]) == layers and list(r["resid_rms"]) == layers
        assert all(len(v) == cfg.n_heads for v in r["attn_logit_max"].values())
        values = [x for v in r["attn_logit_max"].values() for x in v] + list(r["resid_rms"].values())
        assert all(isinstance(x, float) and math.isfinite(x) for x in values + [r["logit_max"]])
        assert all(x > 0 for x in r["resid_rms"].values()) and r["logit_max"] > 0
    logs = [r for r in read_metrics(rms_run) if "val_loss" not in r and r["step"] > 0]
    assert logs and all(not DOCTOR_KEYS & set(r) and "grad_norm" in r for r in logs)  # eval steps only


@pytest.mark.parametrize("step", [3, 6])
def test_logged_values_equal_a_reference_from_run_with_cache(rms_run, text_file, step):
    snap = load_checkpoint(rms_run / f"step_{step:06d}")
    record = next(r for r in read_metrics(rms_run) if r["step"] == step)
    model = snap.model.eval()
    with torch.no_grad():
        logits, cache = model.run_with_cache(first_val_batch(text_file, snap)[:, :-1])
    for layer in range(model.cfg.n_layers):
        scores = cache["attn_scores", layer]  # [batch head q k], -inf above the diagonal
        visible = torch.where(torch.isinf(scores) & (scores < 0), torch.nan, scores)
        by_hand = [max(float(x) for x in visible[:, h].flatten() if not math.isnan(x))
                   for h in range(scores.shape[1])]
        assert record["attn_logit_max"][str(layer)] == pytest.approx(by_hand, abs=1e-5, rel=0)
        resid = cache["resid_post", layer].double()  # [batch pos d_model]
        assert record["resid_rms"][str(layer)] == pytest.approx(float(resid.pow(2).mean().sqrt()),
                                                                rel=1e-6)
        entropy = [round(float(h), 6) for h in series_entropy(cache["pattern", layer].float())]
        assert record["attn_entropy"][str(layer)] == entropy  # the value logged before, bit for bit
    assert record["logit_max"] == pytest.approx(float(logits.abs().max()), abs=1e-5, rel=0)


def test_entropy_is_the_same_with_and_without_the_doctor_metrics():
    torch.manual_seed(0)
    model = build_model(get_preset("transformer4_small").replace(d_vocab=20)).eval()
    block = torch.randint(0, 20, (4, 17))  # [batch n_ctx+1]
    with torch.no_grad():
        full, plain = eval_batch_stats(model, block), eval_batch_stats(model, block, doctor=False)
    assert set(plain) == {"attn_entropy"} and set(full) == {"attn_entropy"} | DOCTOR_KEYS
    assert full["attn_entropy"] == plain["attn_entropy"]


def test_bf16_autocast_reduces_in_float32_and_matches_the_bf16_activations():
    torch.manual_seed(0)
    model = build_model(get_preset("transformer4_rms_small").replace(d_vocab=20)).eval()
    inputs = torch.randint(0, 20, (4, 17))  # [batch n_ctx+1]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        stats = eval_batch_stats(model, inputs)
        logits, cache = model.run_with_cache(inputs[:, :-1])
    scores = cache["attn_scores", 0]
    assert scores.dtype == torch.bfloat16  # the autocast path really ran
    assert stats["attn_logit_max"]["0"] == scores.float().amax(dim=(0, 2, 3)).tolist()
    resid = cache["resid_post", 1].float()
    assert stats["resid_rms"]["1"] == float(resid.square().mean().sqrt())
    assert stats["logit_max"] == float(logits.float().abs().max())


def test_mlp_family_logs_logit_max_only(text_file, tmp_path):
    out = tmp_path / "mlp"
    assert train(text_file, out, "char_mlp_small", "--steps", "4", "--log-every", "2",
                 "--eval-every", "4") == 0
    record = read_metrics(out)[-1]
    assert "logit_max" in record and not {"attn_logit_max", "resid_rms", "attn_entropy"} & set(record)
    snap = load_checkpoint(out)
    with torch.no_grad():
        logits = snap.model.eval()(first_val_batch(text_file, snap)[:, :-1])  # [batch n_ctx vocab]
    assert record["logit_max"] == pytest.approx(float(logits.abs().max()), abs=1e-5, rel=0)


def test_switched_off_the_records_are_as_before(text_file, tmp_path, monkeypatch):
    monkeypatch.setattr(data, "DOCTOR_METRICS", False)
    out = tmp_path / "plain"
    assert train(text_file, out, "transformer4_rms_small", "--steps", "2", "--log-every", "2",
                 "--eval-every", "2") == 0
    records = read_metrics(out)
    assert all("attn_entropy" in r and not DOCTOR_KEYS & set(r) for r in records if "val_loss" in r)


def test_a_diverged_run_writes_null_instead_of_crashing(text_file, tmp_path):
    out = tmp_path / "nan"
    rc = train(text_file, out, "transformer4_small", "--steps", "30", "--log-every", "1",
               "--eval-every", "1", "--save-every", "0", "--optimizer", "sgd", "--lr", "1e4")
    assert rc == 3  # diverged, recorded, stopped
    last = read_metrics(out)[-1]
    assert last["diverged"] and DOCTOR_KEYS <= set(last)
    logged = ([x for v in last["attn_logit_max"].values() for x in v]
              + list(last["resid_rms"].values()) + [last["logit_max"]])
    assert None in logged  # non-finite values written as JSON null, as attn_entropy does
    assert all(x is None or math.isfinite(x) for x in logged)
    text = (out / "metrics.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text  # strict JSON
    assert list_snapshots(out)[-1].name == f"step_{last['step']:06d}"
