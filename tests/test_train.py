"""`python -m train` end to end on a few KB of text written into tmp_path."""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from models.checkpoint import (list_snapshots, load_checkpoint, load_optimizer_state,
                               load_snapshot, read_metrics)
from models import build_model, get_preset
from train.loop import RANK_DUMP_ENV, build_parser, main
from train.config import build_optimizer, lr_at
from train.hyper import resolve_train_config

REPO_ROOT = Path(__file__).resolve().parent.parent
WORDS = "the king queen lord my good sir shall not be what is this that thou art and".split()
RECORD_KEYS = {"step", "tokens", "lr", "train_loss", "step_time_ms", "gwu"}
EVAL_KEYS = {"val_loss", "val_ppl", "bpc", "activations", "attn_logit_max", "resid_rms", "logit_max"}


def tiny_text(n_chars: int = 4000, seed: int = 0) -> str:
    """Short lines of a small vocabulary: learnable within a few dozen steps."""
    rng = random.Random(seed)
    lines: list[str] = []
    while sum(map(len, lines)) < n_chars:
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 8))]
        lines.append(" ".join(words).capitalize() + ".\n")
    return "".join(lines)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "tiny.txt"
    path.write_text(tiny_text(), encoding="utf-8")
    return path


def train(text_file: Path, out: Path, *extra: str) -> int:
    return main(["--data", str(text_file), "--out", str(out), "-q", *extra])


@pytest.fixture(scope="module")
def transformer_run(text_file, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "transformer"
    rc = train(text_file, out, "--preset", "transformer4_rms_small", "--steps", "30",
               "--batch-size", "16", "--log-every", "5", "--eval-every", "10", "--save-every", "10",
               "--seed", "0")
    assert rc == 0
    return out


def tree_digest(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------- recipe pieces


def test_lr_schedule_warmup_then_cosine_to_ten_percent():
    tc = {"lr": 1.0, "warmup": 4, "steps": 14, "schedule": "cosine", "min_lr_ratio": 0.1}
    assert [lr_at(s, tc) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_at(4, tc) == 1.0 and lr_at(13, tc) == pytest.approx(0.1)  # last update at the floor
    assert lr_at(4 + 9 / 2, tc) == pytest.approx(0.55)  # halfway down: (1 + 0.1) / 2
    assert lr_at(13, {**tc, "schedule": "constant"}) == 1.0


def test_hyperparameters_come_from_flag_then_saved_run_then_preset_then_default():
    args = build_parser().parse_args(["--data", "x", "--out", "y", "--lr", "0.5"])
    tc = resolve_train_config(args, {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9,
                                     "warmup_steps": 7, "batch_size": 64},
                              saved={"batch_size": 8, "lr": 0.1})
    assert tc["lr"] == 0.5 and tc["batch_size"] == 8 and tc["momentum"] == 0.9
    assert tc["optimizer"] == "sgd" and tc["warmup"] == 7 and tc["schedule"] == "cosine"
    assert tc["steps"] == 1000 and tc["grad_clip"] == 0.0  # built-in defaults
    with pytest.raises(ValueError, match="--batch-size must be a positive integer"):
        resolve_train_config(build_parser().parse_args(["--data", "x", "--out", "y",
                                                        "--batch-size", "0"]), {}, {})


def test_weight_decay_only_on_matrices():
    model = build_model(get_preset("transformer4_rms_small"))
    opt = build_optimizer(model, {"optimizer": "adamw", "lr": 1e-3, "betas": [0.9, 0.95],
                                  "weight_decay": 0.1}, torch.device("cpu"))
    decayed, plain = opt.param_groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decayed["params"]) and all(p.dim() < 2 for p in plain["params"])
    assert len(decayed["params"]) + len(plain["params"]) == len(list(model.parameters()))
    assert decayed["betas"] == (0.9, 0.95)


# --------------------------------------------------------------------------- one full run


def test_loss_goes_down_and_records_have_every_key(transformer_run):
    records = read_metrics(transformer_run)
    assert [r["step"] for r in records] == [0, 5, 10, 15, 20, 25, 30]
    assert set(records[0]) == {"step", "tokens", "lr", "attn_entropy"} | EVAL_KEYS  # init check
    for r in records[1:]:
        assert RECORD_KEYS <= set(r), r.keys()
        assert r["tokens"] == r["step"] * 16 * 16  # batch 16 x n_ctx 16 targets
        assert r["lr"] == 0.05  # the series' SGD recipe, constant
    evals = [r for r in records if "val_loss" in r]
    assert [r["step"] for r in evals] == [0, 10, 20, 30]
    train_losses = [r["train_loss"] for r in records[1:]]
    assert train_losses[-1] < train_losses[0] - 1.0, train_losses  # seen: 4.2 -> 1.8
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 1.0  # seen: 4.9 -> 1.8
    for r in evals:
        assert r["val_ppl"] == pytest.approx(math.exp(r["val_loss"]))
        assert r["bpc"] == pytest.approx(r["val_loss"] / math.log(2))  # char: 1 char per token


def test_attention_entropy_is_layers_by_heads_and_plausible(transformer_run):
    records = [r for r in read_metrics(transformer_run) if "attn_entropy" in r]
    assert len(records) == 4
    cfg = json.loads((transformer_run / "run.json").read_text())["model"]
    layers, heads = [str(i) for i in range(cfg["n_layers"])], cfg["n_heads"]
    assert len(layers) >= 2 and heads == 4
    # the series' mean over all rows of a 16-key causal head lies in [0, ln(16!)/16] (uniform)
    uniform = math.lgamma(17) / 16
    for r in records:
        ent = r["attn_entropy"]
        assert sorted(ent) == layers and all(len(v) == heads for v in ent.values())
        assert all(0.0 <= h <= uniform + 1e-6 for v in ent.values() for h in v)


def test_gwu_rows_use_series_names_and_match_sgd_nominal_scale(transformer_run):
    record = read_metrics(transformer_run)[-1]
    gwu = record["gwu"]
    assert "blocks.0.attention.heads.3.W_V" in gwu and "W_pos" in gwu and "blocks.1.rms1.gamma" in gwu
    assert list(gwu) == list(load_checkpoint(transformer_run).model.series_parameters())  # a row per head
    for name, row in gwu.items():
        assert set(row) == {"g", "w", "u", "u_nominal"}
        assert row["w"] > 0 and row["g"] > 0 and 0 < row["u"] < 1, name


def test_run_json_and_snapshots(transformer_run, text_file):
    run = json.loads((transformer_run / "run.json").read_text())
    assert run["preset"] == "transformer4_rms_small" and run["world_size"] == 1
    assert run["data"]["sha256"] == hashlib.sha256(text_file.read_bytes()).hexdigest()
    assert run["data"]["size_bytes"] == text_file.stat().st_size
    assert run["tokenizer"]["kind"] == "char" and run["model"]["d_vocab"] == run["tokenizer"]["vocab_size"]
    assert run["train"]["optimizer"] == "sgd" and run["torch"] == torch.__version__
    assert [p.name for p in list_snapshots(transformer_run)] == [
        "step_000000", "step_000010", "step_000020", "step_000030"]
    snap = load_checkpoint(transformer_run)
    assert snap.step == 30 and snap.tokens_seen == 30 * 16 * 16
    assert snap.meta["train_config"]["steps"] == 30
    assert load_optimizer_state(snap.path)["state"]  # momentum buffers saved for --resume


def test_mlp_family_trains(text_file, tmp_path):
    out = tmp_path / "mlp"
    assert train(text_file, out, "--preset", "char_mlp_small", "--steps", "30", "--optimizer", "adam",
                 "--lr", "1e-2", "--batch-size", "8", "--grad-accum", "2", "--log-every", "5",
                 "--eval-every", "15", "--seed", "0") == 0
    records = read_metrics(out)
    losses = [r["train_loss"] for r in records if "train_loss" in r]
    assert losses[-1] < losses[0] - 0.5, losses
    assert all("attn_entropy" not in r for r in records)  # no attention heads
    # 8 x 2 accumulated windows per step, 8 predictions (one per n_ctx window) per 16-token block
    assert records[-1]["tokens"] == 30 * 8 * 2 * 8
    assert load_checkpoint(out).step == 30


def test_bpe_tokenizer_bpc_divides_by_characters_per_token(text_file, tmp_path):
    out = tmp_path / "bpe"
    assert train(text_file, out, "--preset", "transformer4_rms_small", "--tokenizer", "bpe",
                 "--bpe-vocab", "320", "--steps", "2", "--batch-size", "8", "--eval-batches", "1") == 0
    run = json.loads((out / "run.json").read_text())
    assert run["tokenizer"] == {"kind": "bpe", "vocab_size": 320} and run["model"]["d_vocab"] == 320
    chars_per_token = run["data"]["chars_per_token"]
    assert chars_per_token > 1.0  # merges: a token covers more than one character on average
    last = read_metrics(out)[-1]
    assert last["bpc"] == pytest.approx(last["val_loss"] / math.log(2) / chars_per_token)
    assert load_checkpoint(out).tokenizer.kind == "bpe"


# --------------------------------------------------------------------------- resume / refuse


def test_resume_continues_exactly_like_a_continuous_run(text_file, tmp_path):
    common = ["--preset", "transformer4_rms_small", "--optimizer", "adamw", "--lr", "3e-3", "--batch-size", "8",
              "--weight-decay", "0.1", "--log-every", "2", "--eval-every", "4", "--save-every", "4",
              "--seed", "3"]
    assert train(text_file, tmp_path / "full", *common, "--steps", "8") == 0
    assert train(text_file, tmp_path / "split", *common, "--steps", "4") == 0
    assert train(text_file, tmp_path / "split", "--resume", "--steps", "8", "-q") == 0
    full, split = load_snapshot(tmp_path / "full/step_000008"), load_snapshot(tmp_path / "split/step_000008")
    assert split.step == 8 and split.tokens_seen == full.tokens_seen
    for name, tensor in full.model.state_dict().items():
        assert torch.equal(tensor, split.model.state_dict()[name]), name
    opt_full = load_optimizer_state(full.path)["state"]
    opt_split = load_optimizer_state(split.path)["state"]
    assert opt_full.keys() == opt_split.keys()
    for key in opt_full:
        assert float(opt_split[key]["step"]) == 8.0
        for field in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(opt_full[key][field], opt_split[key][field])
    steps = [r["step"] for r in read_metrics(tmp_path / "split")]
    assert steps == [r["step"] for r in read_metrics(tmp_path / "full")] == [0, 2, 4, 6, 8]


def test_refuses_to_overwrite_an_existing_run(transformer_run, text_file, capsys):
    before = tree_digest(transformer_run)
    rc = train(text_file, transformer_run, "--preset", "char_mlp_small", "--steps", "2")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("error: ") and "--resume" in err[0]
    assert tree_digest(transformer_run) == before


def test_ctrl_c_saves_a_snapshot_and_exits_130(text_file, tmp_path):
    out = tmp_path / "interrupted"
    metrics = out / "metrics.jsonl"

    def interrupt_after_step_3() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if metrics.is_file() and any(json.loads(ln)["step"] >= 3 for ln in metrics.read_text().splitlines()):
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=interrupt_after_step_3, daemon=True)
    watcher.start()
    rc = train(text_file, out, "--preset", "char_mlp_small", "--steps", "100000", "--log-every", "1",
               "--eval-every", "1000", "--save-every", "0")
    watcher.join()
    assert rc == 130
    snaps = list_snapshots(out)
    last_logged = read_metrics(out)[-1]["step"]
    assert snaps[0].name == "step_000000" and 3 <= load_snapshot(snaps[-1]).step < 100000
    assert load_snapshot(snaps[-1]).step >= last_logged


# --------------------------------------------------------------------------- dtype / bad input


def test_bf16_autocast_step_on_cpu(text_file, tmp_path):
    out = tmp_path / "bf16"
    assert train(text_file, out, "--preset", "transformer4_rms_small", "--steps", "1",
                 "--batch-size", "8", "--dtype", "bf16", "--eval-batches", "1") == 0
    last = read_metrics(out)[-1]
    assert last["step"] == 1 and math.isfinite(last["train_loss"]) and math.isfinite(last["val_loss"])
    assert json.loads((out / "run.json").read_text())["train"]["dtype"] == "bf16"


@pytest.mark.parametrize("case", ["missing_data", "unknown_preset", "too_short", "bad_set"])
def test_bad_input_is_one_line_and_exit_2(case, text_file, tmp_path, capsys):
    short = tmp_path / "short.txt"
    short.write_text("To be.", encoding="utf-8")
    args = {"missing_data": ["--data", str(tmp_path / "nope.txt"), "--preset", "char_mlp_small"],
            "unknown_preset": ["--data", str(text_file), "--preset", "no_such_model"],
            "too_short": ["--data", str(short), "--preset", "transformer4_rms_small"],
            "bad_set": ["--data", str(text_file), "--preset", "char_mlp_small", "--set", "d_embed=x"]}
    expected = {"missing_data": "does not exist", "unknown_preset": "unknown preset 'no_such_model'",
                "too_short": "fewer than one context window of 17", "bad_set": "d_embed must be int"}
    rc = main([*args[case], "--out", str(tmp_path / "run"), "-q"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: "), err
    assert expected[case] in err[0]
    assert not (tmp_path / "run").exists()


def test_too_short_text_from_a_real_process(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("To be, or not", encoding="utf-8")  # 13 chars: 12 train + 1 val tokens
    proc = subprocess.run([sys.executable, "-m", "train", "--preset", "transformer4_rms_small",
                           "--data", str(short), "--out", str(tmp_path / "run")],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: the train split of {short} has 12 tokens, fewer than one context window of 17 "
        "(n_ctx=16); use a longer text or a smaller --val-fraction"]


# --------------------------------------------------------------------------- DDP on CPU


@pytest.mark.slow
def test_ddp_two_ranks_on_cpu(text_file, tmp_path):
    out, dumps = tmp_path / "ddp", tmp_path / "rank_states"
    dumps.mkdir()
    env = {**os.environ, RANK_DUMP_ENV: str(dumps), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "-m", "train", "--preset", "transformer4_rms_small", "--data", str(text_file),
         "--out", str(out), "--steps", "4", "--log-every", "2", "--eval-every", "4",
         "--device", "cpu", "--optimizer", "adamw", "--lr", "3e-3", "--batch-size", "8"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "run.json").read_text())["world_size"] == 2
    assert sorted(p.name for p in out.iterdir()) == [
        "metrics.jsonl", "run.json", "step_000000", "step_000004"]  # no .train.lock left
    records = read_metrics(out)
    assert [r["step"] for r in records] == [0, 2, 4]  # one writer: no duplicated records
    assert records[-1]["tokens"] == 4 * 2 * 8 * 16  # both ranks' windows counted
    rank0, rank1 = (load_file(str(dumps / f"rank{r}.safetensors")) for r in (0, 1))
    final = load_snapshot(out / "step_000004").model.state_dict()
    start = load_snapshot(out / "step_000000").model.state_dict()
    for name, tensor in final.items():
        assert torch.equal(rank0[name], rank1[name]), name  # DDP kept the replicas in sync
        assert torch.equal(rank0[name], tensor), name  # and rank 0 saved exactly that
    assert any(not torch.equal(final[n], start[n]) for n in final)  # and it did train


# --------------------------------------------------------------------------- the console and divergence


def test_diverged_run_saves_that_moment_names_parameters_and_exits_3(text_file, tmp_path, caplog):
    out = tmp_path / "nan"
    caplog.set_level("INFO", logger="train")
    rc = main(["--data", str(text_file), "--out", str(out), "--preset", "transformer4_small",
               "--steps", "40", "--batch-size", "8", "--log-every", "2", "--eval-every", "4",
               "--save-every", "0", "--optimizer", "sgd", "--lr", "1e6"])
    assert rc == 3
    records = read_metrics(out)
    bad = [r for r in records if r.get("diverged")]
    assert len(bad) == 1 and bad[0] is records[-1]  # it stopped at the first diverged record
    step = bad[0]["step"]
    assert step < 40 and 1 <= bad[0]["diverged"]["first_nonfinite_loss_step"] <= step
    assert list_snapshots(out)[-1].name == f"step_{step:06d}"  # the moment it diverged is kept
    assert load_snapshot(list_snapshots(out)[-1]).nonfinite_params() == bad[0]["diverged"]["nonfinite_params"]
    message = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"][-1]
    assert f"training diverged at step {step}" in message and "--keep-going" in message


def test_keep_going_trains_to_the_end_after_a_divergence(text_file, tmp_path):
    out = tmp_path / "nan"
    rc = train(text_file, out, "--preset", "transformer4_small", "--steps", "12", "--batch-size", "8",
               "--log-every", "2", "--eval-every", "4", "--save-every", "0", "--optimizer", "sgd",
               "--lr", "1e6", "--keep-going")
    assert rc == 0 and read_metrics(out)[-1]["step"] == 12
    assert any(r.get("diverged") for r in read_metrics(out))


def test_console_is_one_line_per_record_with_group_summary_or_full_table(text_file, tmp_path, caplog):
    caplog.set_level("INFO", logger="train")
    main(["--data", str(text_file), "--out", str(tmp_path / "a"), "--preset", "transformer4_rms_small",
          "--steps", "4", "--batch-size", "4", "--log-every", "2", "--eval-every", "4"])
    lines = [r.getMessage() for r in caplog.records]
    steps = [l for l in lines if l.startswith("step ")]
    assert steps[-1].startswith("step 4/4 | loss ") and "H min " in steps[-1] and "{" not in steps[-1]
    assert any(l.strip().startswith("log10 u: embeddings") for l in lines)
    assert not any("blocks.0.attention.heads.0.W_Q" in l for l in lines)
    caplog.clear()
    main(["--data", str(text_file), "--out", str(tmp_path / "b"), "--preset", "transformer4_rms_small",
          "--steps", "4", "--batch-size", "4", "--log-every", "2", "--eval-every", "4", "--gwu-table"])
    assert any("blocks.0.attention.heads.0.W_Q" in r.getMessage() for r in caplog.records)


def test_warmup_longer_than_the_run_and_a_flat_loss_are_warned_about(text_file, tmp_path, caplog):
    caplog.set_level("INFO", logger="train")
    main(["--data", str(text_file), "--out", str(tmp_path / "w"), "--preset", "transformer4_rms_small",
          "--steps", "20", "--batch-size", "4", "--log-every", "2", "--eval-every", "10",
          "--warmup", "715", "--lr", "1e-9", "-q"])
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("never reaches" in w for w in warnings)
    assert any("has not moved" in w for w in warnings)


def test_resume_needs_no_data_when_the_run_recorded_it(text_file, tmp_path):
    out = tmp_path / "r"
    assert train(text_file, out, "--preset", "transformer4_rms_small", "--steps", "4",
                 "--batch-size", "4", "--save-every", "2") == 0
    assert main(["--out", str(out), "--resume", "--steps", "6", "-q"]) == 0
    assert read_metrics(out)[-1]["step"] == 6
    fresh = tmp_path / "fresh"
    assert main(["--out", str(fresh), "--preset", "transformer4_rms_small", "-q"]) == 2


def test_snapshot_files_follow_the_umask(text_file, tmp_path):
    old = os.umask(0o022)
    try:
        out = tmp_path / "u"
        assert train(text_file, out, "--preset", "transformer4_rms_small", "--steps", "2",
                     "--batch-size", "4") == 0
    finally:
        os.umask(old)
    modes = {p.relative_to(out).as_posix(): p.stat().st_mode & 0o777 for p in out.rglob("*") if p.is_file()}
    assert modes and all(mode == 0o644 for mode in modes.values()), modes
