"""Runs that cannot be mixed or lost: two writers, a full disk, killed saves, changed schedules,
foreign optimizer state. Each case checks that nothing already on disk is lost."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from models.checkpoint import list_snapshots, load_snapshot, read_metrics
from train.run_lock import LOCK_FILE
from train.loop import main

REPO = Path(__file__).resolve().parent.parent
TEXT = "".join(f"the king {w} shall not be what thou art and my good lord.\n"
               for w in ("and", "queen", "sir", "is", "this") * 40)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "t.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def train(data: Path, out: Path, *extra: str) -> int:
    return main(["--preset", "transformer4_rms_small", "--data", str(data), "--out", str(out), "-q",
                 "--batch-size", "4", "--log-every", "2", "--eval-every", "4", *extra])


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_a_second_writer_is_refused_naming_the_holder(data, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "train", "--preset", "transformer4_rms_small", "--data", str(data),
           "--out", str(out), "--batch-size", "4", "--log-every", "5", "--eval-every", "50",
           "--steps", "100000", "--save-every", "0", "-q"]
    first = subprocess.Popen(cmd, cwd=REPO, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.time() + 60
        while not (out / "step_000000").is_dir() and time.time() < deadline:
            time.sleep(0.1)
        assert (out / "step_000000").is_dir(), "the first trainer never started"
        second = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
        resumed = subprocess.run(cmd + ["--resume"], cwd=REPO, capture_output=True, text=True, timeout=120)
        for proc in (second, resumed):
            assert proc.returncode == 2, proc.stderr
            assert f"is being trained by another process (pid {first.pid})" in proc.stderr
            assert proc.stderr.count("\n") == 1
    finally:
        first.send_signal(signal.SIGINT)  # saves a snapshot and exits 130
        assert first.wait(timeout=120) == 130, first.stderr.read()
    steps = [r["step"] for r in read_metrics(out)]
    assert steps == sorted(set(steps))  # one writer: no duplicated or interleaved records
    seeds = {load_snapshot(p).meta["train_config"]["seed"] for p in list_snapshots(out)}
    assert len(seeds) == 1
    last = load_snapshot(list_snapshots(out)[-1]).step
    assert train(data, out, "--resume", "--steps", str(last + 2)) == 0  # the lock went with it


def test_disk_full_mid_save_is_one_line_and_keeps_the_previous_snapshot(data, tmp_path, capsys,
                                                                         monkeypatch):
    out = tmp_path / "run"
    assert train(data, out, "--steps", "2", "--save-every", "2") == 0
    before = {p.name: (p / "model.safetensors").read_bytes() for p in list_snapshots(out)}
    import models.store.snapshot as checkpoint

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(out / ".step_000004.tmp-6633"))

    monkeypatch.setattr(checkpoint, "save_file", full_disk)
    capsys.readouterr()
    assert train(data, out, "--resume", "--steps", "4", "--save-every", "2") == 2
    line = error_line(capsys)  # names the run and what is free, never the temporary directory
    assert line.startswith(f"error: no space left on the device holding {out} (") and ".tmp-" not in line
    assert "MB free, a snapshot needs " in line and "snapshot step_000004 not saved; any earlier snapshot is intact" in line
    assert {p.name: (p / "model.safetensors").read_bytes() for p in list_snapshots(out)} == before
    assert not [p.name for p in out.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


def test_leftovers_of_a_killed_save_are_cleaned_by_the_next_training(data, tmp_path, caplog):
    out = tmp_path / "run"
    assert train(data, out, "--steps", "4", "--save-every", "2") == 0
    dead = 4_000_000  # above pid_max: no such process
    (out / f".step_000006.tmp-{dead}").mkdir()
    (out / f".step_000006.tmp-{dead}" / "model.safetensors").write_bytes(b"partial")
    os.rename(out / "step_000004", out / f".step_000004.old-{dead}")  # killed mid-swap
    assert [p.name for p in list_snapshots(out)] == ["step_000000", "step_000002"]  # readers ignore them
    caplog.set_level("WARNING", logger="train")
    assert train(data, out, "--resume", "--steps", "6") == 0
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert f".step_000006.tmp-{dead}" in messages and "restored step_000004" in messages
    assert not [p.name for p in out.iterdir() if p.name.startswith(".step_")]
    assert [p.name for p in list_snapshots(out)][-2:] == ["step_000004", "step_000006"]


def test_resume_refuses_a_changed_cosine_horizon_unless_asked(data, tmp_path, capsys):
    out = tmp_path / "run"
    assert train(data, out, "--steps", "4", "--warmup", "1", "--save-every", "2",
                 "--optimizer", "adamw", "--lr", "1e-3") == 0
    (out / "step_000004").rename(out / "moved")  # resume from step 2, as after a kill
    capsys.readouterr()
    assert train(data, out, "--resume", "--steps", "8") == 2
    assert "cosine schedule decays over 4 steps" in error_line(capsys)
    assert "resumes" not in json.loads((out / "run.json").read_text())  # a failed resume adds nothing
    assert train(data, out, "--resume", "--steps", "8", "--new-schedule") == 0
    assert len(json.loads((out / "run.json").read_text())["resumes"]) == 1


@pytest.mark.parametrize("case", ["a_list", "other_shapes"])
def test_foreign_optimizer_state_is_refused_naming_the_file(case, data, tmp_path, capsys):
    out = tmp_path / "run"
    assert train(data, out, "--steps", "2", "--save-every", "2", "--optimizer", "adam",
                 "--lr", "1e-3") == 0
    path = out / "step_000002" / "optimizer.pt"
    state = torch.load(path, weights_only=True)
    if case == "a_list":
        state = [1, 2, 3]
    else:
        first = next(iter(state["state"]))
        state["state"][first]["exp_avg"] = torch.zeros(3, 3)
    torch.save(state, path)
    capsys.readouterr()
    assert train(data, out, "--resume", "--steps", "4") == 2
    line = error_line(capsys)
    assert "optimizer.pt: optimizer state does not fit this model" in line
    assert "resumes" not in json.loads((out / "run.json").read_text())


def test_garbage_metrics_line_does_not_block_resume(data, tmp_path, caplog):
    out = tmp_path / "run"
    assert train(data, out, "--steps", "4", "--save-every", "2") == 0
    lines = (out / "metrics.jsonl").read_text().splitlines()
    lines.insert(2, "this is not json")
    (out / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert train(data, out, "--resume", "--steps", "6") == 0
    assert [r["step"] for r in read_metrics(out)] == [0, 2, 4, 6]
    assert any("metrics.jsonl: skipping line 3" in r.getMessage() for r in caplog.records)


def test_the_lock_file_goes_with_a_clean_exit_and_a_failed_fresh_run_leaves_nothing(data, tmp_path):
    out = tmp_path / "run"
    assert main(["--preset", "no_such_preset", "--data", str(data), "--out", str(out), "-q"]) == 2
    assert not out.exists()
    assert train(data, out, "--steps", "2") == 0
    assert not (out / LOCK_FILE).exists()  # it used to stay in every finished run
    assert train(data, out, "--resume", "--steps", "2") == 2  # refused after locking: still none left
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl", "run.json", "step_000000", "step_000002"]


def test_the_lock_is_exclusive_while_held_and_a_stale_handle_does_not_share_it(tmp_path):
    import fcntl

    from train.run_lock import RunLock

    held = RunLock(tmp_path).acquire()
    with pytest.raises(ValueError, match=f"being trained by another process \\(pid {os.getpid()}\\)"):
        RunLock(tmp_path).acquire()
    stale = os.open(held.path, os.O_RDWR)  # a trainer that opened the file just before it went
    held.release()
    assert not held.path.exists()
    fcntl.flock(stale, fcntl.LOCK_EX | fcntl.LOCK_NB)  # it locks the unlinked file...
    again = RunLock(tmp_path).acquire()  # ...which does not keep the next trainer out, nor share with it
    assert again._still_linked(again.fd) and not again._still_linked(stale)
    os.close(stale)
    again.release()


# --------------------------------------------------------------------------- bad settings and files


@pytest.mark.parametrize("flag, message", [
    (("--lr", "inf"), "--lr must be a finite number > 0"),
    (("--momentum", "nan"), "--momentum must be a number in [0, 1)"),
    (("--min-lr-ratio", "-3"), "--min-lr-ratio must be a number in [0, 1]"),
    (("--weight-decay", "-1"), "--weight-decay must be a finite number >= 0"),
    (("--betas", "0.9,1.5"), "--betas must be two numbers in [0, 1)")])
def test_bad_settings_are_refused(flag, message, data, tmp_path, capsys):
    assert train(data, tmp_path / "run", *flag) == 2
    assert message in error_line(capsys)
    assert not (tmp_path / "run").exists()


def saved(tmp_path: Path) -> Path:
    from models import build_model, get_preset
    from models.checkpoint import save_snapshot
    from models.tokenizers import CharTokenizer

    snap = tmp_path / "snap"
    save_snapshot(snap, build_model(get_preset("transformer4_rms_small", d_vocab=5)),
                  CharTokenizer.from_text("abcde"), step=3)
    return snap


@pytest.mark.parametrize("edit, message", [
    (lambda m: m["model"].update(norm_eps=float("inf")), "norm_eps must be a finite number"),
    (lambda m: m.update(step="many"), "'step' must be a non-negative integer, got 'many'"),
    (lambda m: m.update(step=-5), "'step' must be a non-negative integer, got -5"),
    (lambda m: m["tokenizer"].update(files=5), "'tokenizer.files' must be a list of file names"),
    (lambda m: m["tokenizer"].update(files=["../../../../etc/passwd"]), "must be a plain file name")])
def test_bad_config_json_is_refused_in_one_line(edit, message, tmp_path):
    snap = saved(tmp_path)
    meta = json.loads((snap / "config.json").read_text())
    edit(meta)
    (snap / "config.json").write_text(json.dumps(meta))  # inf is written as Infinity
    proc = subprocess.run([sys.executable, "-m", "probes.entropy", "--ckpt", str(snap), "--text", "abc"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert message in proc.stderr


def test_nan_weights_are_reported_as_non_finite_not_as_healthy_numbers(tmp_path):
    """The logit lens used to report rank 0 (top-1) for NaN logits; entropy printed nan silently."""
    from models import build_model, get_preset
    from models.checkpoint import save_snapshot
    from models.tokenizers import CharTokenizer

    model = build_model(get_preset("transformer4_rms_small", d_vocab=5))
    with torch.no_grad():
        model.blocks[2].attention.heads[0].W_Q.fill_(float("nan"))
    snap = tmp_path / "nan"
    save_snapshot(snap, model, CharTokenizer.from_text("abcde"))
    run = lambda probe, *a: subprocess.run([sys.executable, "-m", f"probes.{probe}", "--ckpt", str(snap),
                                            "--text", "abcdeabcde", *a], cwd=REPO, capture_output=True,
                                           text=True, timeout=120)
    lens = run("logit_lens", "--json")
    data = json.loads(lens.stdout)
    assert data["target_rank"][-1] is None and data["kl_to_final"][-1] is None
    assert data["target_rank"][0] is not None  # the embedding, before the NaN, still reads
    assert data["top_k"][3][0][0] == [] and data["top_k"][2][0][0] != []  # no top token where NaN
    table = run("logit_lens")
    assert "warning: the lens at 2_post, 3_post is NaN or inf" in table.stderr  # only those layers
    assert "3_post  (NaN)\n" in table.stdout and "'d' nan" not in table.stdout
    ent = run("entropy")
    assert ent.returncode == 0 and "warning: attention in layer(s) 2, 3 is NaN or inf" in ent.stderr
    assert json.loads(run("entropy", "--json").stdout)["entropy"][2][0] is None


# --------------------------------------------------------------------------- inputs that used to crash or lie


@pytest.fixture(scope="module")
def snap_dir(tmp_path_factory) -> Path:
    return saved(tmp_path_factory.mktemp("snap"))


@pytest.mark.parametrize("args, message", [
    (("--device", "meta"), "cannot run a model"),
    (("--device", "mps"), "MPS is not available"),
    (("--device", "cpu:1"), "device 'cpu:1' does not exist: this machine has only cpu"),
    (("--batch-size", "100000000"), "batch size 100000000"),
    (("--text-file", "/dev/zero"), "/dev/zero: a character device, not a regular file"),
])
def test_probe_inputs_that_crashed_are_one_line(args, message, snap_dir, capsys):
    from probes import entropy

    rc = entropy.main(["--ckpt", str(snap_dir), *(args if "--text-file" in args else ("--text", "abc", *args))])
    assert rc == 2 and message in error_line(capsys)


def test_samples_beyond_the_memory_limit_and_ignored_flags(snap_dir, tmp_path, capsys, caplog):
    from probes import entropy, logit_lens

    corpus = tmp_path / "abc.txt"
    corpus.write_text("abcde" * 200)
    assert entropy.main(["--ckpt", str(snap_dir), "--data", str(corpus), "--samples", "100000000"]) == 2
    assert "token limit" in error_line(capsys)
    assert logit_lens.main(["--ckpt", str(snap_dir), "--text", "abcab", "-k", "1000000"]) == 2
    assert "-k 1000000 is more than the vocabulary's 5 tokens" in error_line(capsys)
    assert entropy.main(["--ckpt", str(snap_dir), "--text", "abcab", "--samples", "5"]) == 0
    assert any("--samples applies to --data only" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("args, message", [
    (("--device", "meta"), "cannot run a model"),
    (("--device", "cpu:3"), "device 'cpu:3' does not exist"),
    (("--batch-size", "100000000"), "more than any machine holds"),
])
def test_training_inputs_that_crashed_are_one_line(args, message, data, tmp_path, capsys):
    assert train(data, tmp_path / "run", *args) == 2
    assert message in error_line(capsys)


def test_training_on_an_endless_file_is_refused(tmp_path, capsys):
    assert main(["--preset", "transformer4_rms_small", "--data", "/dev/zero", "--out", str(tmp_path / "r"),
                 "-q"]) == 2
    assert "larger than 2 GB" in error_line(capsys)


def test_ctrl_c_before_the_loop_starts_exits_130(data, tmp_path, monkeypatch, capsys):
    import train.start as start

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(start, "load_corpus", interrupted)
    assert train(data, tmp_path / "run") == 130
    assert capsys.readouterr().err.strip() == "interrupted"


def test_resume_refuses_another_tokenizer(data, tmp_path, capsys):
    out = tmp_path / "run"
    assert train(data, out, "--steps", "2", "--save-every", "2") == 0
    assert train(data, out, "--resume", "--steps", "4", "--tokenizer", "bpe") == 2
    assert "would change what the run fixes (the char tokenizer)" in error_line(capsys)


def test_a_config_far_bigger_than_the_weights_fails_before_allocating(tmp_path):
    from models import build_model, get_preset

    cfg = get_preset("transformer4_rms_small", d_vocab=5)
    torch.save(build_model(cfg).state_dict(), tmp_path / "model.pt")
    (tmp_path / "huge.json").write_text(json.dumps({**cfg.to_dict(), "n_layers": 3000, "d_model": 4096,
                                                    "d_mlp": 16384, "n_heads": 32, "d_head": 128}))
    proc = subprocess.run([sys.executable, "-m", "probes.entropy", "--ckpt", str(tmp_path / "model.pt"),
                           "--config", str(tmp_path / "huge.json"), "--text", "abc"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "model.pt: the config has 3000 blocks but the weights have 4" in proc.stderr


def rewrite_weights(snap: Path, edit) -> None:
    """Change model.safetensors and record its new sha256, as a tool that rewrote it would."""
    import hashlib

    from safetensors.torch import load_file, save_file

    weights = snap / "model.safetensors"
    state = load_file(str(weights))
    edit(state)
    save_file(state, str(weights))
    meta = json.loads((snap / "config.json").read_text())
    meta["tensors_sha256"] = hashlib.sha256(weights.read_bytes()).hexdigest()
    (snap / "config.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool])
def test_integer_weights_are_refused_naming_the_tensor(dtype, tmp_path):
    from models.checkpoint import CheckpointError

    snap = saved(tmp_path)
    name = "blocks.1.mlp.net.0.weight"
    rewrite_weights(snap, lambda state: state.update({name: torch.zeros_like(state[name], dtype=dtype)}))
    kind = str(dtype).removeprefix("torch.")
    with pytest.raises(CheckpointError, match=f"tensor '{name}' is stored as {kind}, but the model "
                                              r"expects floating-point weights \(float32\)"):
        load_snapshot(snap)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_weights_load_and_are_said_once(dtype, tmp_path, caplog):
    snap = saved(tmp_path)
    rewrite_weights(snap, lambda state: state.update({k: v.to(dtype) for k, v in state.items()}))
    loaded = load_snapshot(snap)
    assert {p.dtype for p in loaded.model.parameters()} == {torch.float32}
    said = [r.getMessage() for r in caplog.records if "stored as" in r.getMessage()]
    assert len(said) == 1 and str(dtype).removeprefix("torch.") in said[0], said


def test_a_pickle_protocol_warning_does_not_precede_the_one_line_error(tmp_path):
    import warnings

    from models.checkpoint import CheckpointError, load_checkpoint

    # torch warns of protocol 4 (two lines), then its weights_only unpickler fails on it
    torch.save({"W_out": torch.zeros(2)}, tmp_path / "old.pt", pickle_protocol=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(CheckpointError, match="cannot load with torch.load"):
            load_checkpoint(tmp_path / "old.pt", preset="transformer4_rms_small")
    assert [str(w.message) for w in caught] == []
