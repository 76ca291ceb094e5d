"""nanoGPT checkpoints load as our model: logits equal to nanoGPT's own module, its meta.pkl
vocabulary, a folder of numbered checkpoints read as a run, and bad files refused in one line."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from close import assert_close_to_scale
from nanogpt_ref import GPT, GPTConfig, save_like_nanogpt, write_meta_pkl

from models.checkpoint import CheckpointError, is_run_dir, list_snapshots, load_checkpoint, snapshot_step

REPO = Path(__file__).resolve().parents[1]
CHARS = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"  # shakespeare_char's 65


def nanogpt(bias: bool = True, seed: int = 0, **changes) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(bias=bias, **changes)).eval()


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("compiled", [False, True])
def test_nanogpt_checkpoint_gives_its_modules_logits(tmp_path, bias, compiled):
    ref = nanogpt(bias)
    saved = torch.compile(ref) if compiled else ref  # compile is lazy: only the names change
    save_like_nanogpt(saved, tmp_path / "ckpt.pt")
    assert any(k.startswith("_orig_mod.") for k in torch.load(tmp_path / "ckpt.pt", weights_only=True)["model"]) == compiled
    snap = load_checkpoint(tmp_path / "ckpt.pt")
    tokens = torch.randint(0, 65, (3, 16))  # [batch pos], the whole block_size
    with torch.no_grad():
        want = ref(tokens)  # [batch pos vocab]
        assert_close_to_scale(snap.model(tokens), want)
        logits, cache = snap.model.run_with_cache(tokens)  # the explicit path, every hook firing
    assert_close_to_scale(logits, want)
    assert cache["blocks.1.attn.hook_pattern"].shape == (3, 4, 16, 16)
    cfg = snap.config
    assert (cfg.attn_bias, cfg.mlp_bias, cfg.norm_bias) == (bias, bias, bias)
    assert (cfg.act_fn, cfg.unembed, cfg.n_ctx, cfg.d_head) == ("gelu", "tied", 16, 8)
    assert snap.step == 250 and snap.meta["best_val_loss"] == pytest.approx(1.4697)
    assert snap.meta["train_config"]["dataset"] == "shakespeare_char" and snap.tokenizer is None


def test_meta_pkl_in_the_nanogpt_checkout_is_the_vocabulary(tmp_path):
    root = tmp_path / "nanoGPT"
    (root / "out-shakespeare-char").mkdir(parents=True)
    save_like_nanogpt(nanogpt(), root / "out-shakespeare-char" / "ckpt.pt")
    write_meta_pkl(root / "data" / "shakespeare_char" / "meta.pkl", CHARS)
    snap = load_checkpoint(root / "out-shakespeare-char")  # the out_dir: its ckpt.pt
    assert snap.encode("ROMEO:")[0].tolist() == [CHARS.index(c) for c in "ROMEO:"]
    assert snap.decode(snap.encode("O Romeo!")) == "O Romeo!"
    given = load_checkpoint(root / "out-shakespeare-char" / "ckpt.pt", tokenizer=root / "data" / "shakespeare_char" / "meta.pkl")
    assert given.tokenizer.chars == tuple(CHARS)


def test_without_a_vocabulary_it_is_token_ids_only_said_once(tmp_path, caplog):
    save_like_nanogpt(nanogpt(), tmp_path / "ckpt.pt", dataset="elsewhere")
    snap = load_checkpoint(tmp_path / "ckpt.pt")
    lines = [r.getMessage() for r in caplog.records if "token ids only" in r.getMessage()]
    assert len(lines) == 1 and "--tokenizer PATH/meta.pkl" in lines[0]
    with pytest.raises(ValueError, match=r"has no tokenizer \(token ids only\): no meta\.pkl beside it"):
        snap.encode("hi")


def test_gpt2_sized_vocabulary_without_its_files_says_how_to_pass_them(tmp_path, caplog):
    save_like_nanogpt(nanogpt(vocab_size=50304, n_layer=1, n_embd=16), tmp_path / "ckpt.pt")
    snap = load_checkpoint(tmp_path / "ckpt.pt")
    assert snap.tokenizer is None and "GPT-2's BPE" in snap.meta["tokenizer_hint"]
    assert any("pass --tokenizer DIR" in r.getMessage() for r in caplog.records)


def test_folder_of_numbered_checkpoints_is_a_run(tmp_path):
    run = tmp_path / "out"
    run.mkdir()
    for step in (500, 1000, 250):
        save_like_nanogpt(nanogpt(seed=step), run / f"ckpt_{step:06d}.pt", iter_num=step)
    (run / "notes.txt").write_text("not a checkpoint")
    assert is_run_dir(run) and [snapshot_step(p) for p in list_snapshots(run)] == [250, 500, 1000]
    latest = load_checkpoint(run)
    assert latest.step == 1000 and latest.name == "out/ckpt_001000.pt"
    tokens = torch.arange(10)[None]
    with torch.no_grad():
        assert_close_to_scale(latest.model(tokens), nanogpt(seed=1000)(tokens))
    from probes import updates  # g/w/u between two snapshots works on those files, by step
    assert updates.main(["--ckpt", str(run), "--between", "250", "500", "--json"]) == 0


def test_probe_cli_runs_on_a_nanogpt_checkpoint(tmp_path):
    save_like_nanogpt(nanogpt(), tmp_path / "ckpt.pt")
    write_meta_pkl(tmp_path / "meta.pkl", CHARS)
    proc = subprocess.run([sys.executable, "-m", "probes.entropy", "--ckpt", str(tmp_path / "ckpt.pt"),
                           "--text", "ROMEO: O", "--json"], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert '"entropy"' in proc.stdout or '"mean"' in proc.stdout


# --------------------------------------------------------------------------- bad input


def cli_error(*args: str) -> str:
    """The probe CLI's stderr for bad input: exit 2 and exactly one line."""
    proc = subprocess.run([sys.executable, "-m", "probes.entropy", *args, "--text", "abc"], cwd=REPO,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    return proc.stderr


def test_pt_of_neither_format_names_its_keys(tmp_path):
    torch.save({"weights": torch.zeros(3), "step": 7, "notes": "x"}, tmp_path / "other.pt")
    before = sorted(os.listdir(tmp_path))
    error = cli_error("--ckpt", str(tmp_path / "other.pt"))
    assert "other.pt: a series .pt needs --preset or --config" in error
    assert "not a nanoGPT checkpoint (no 'model_args')" in error and "['weights', 'step', 'notes']" in error
    assert sorted(os.listdir(tmp_path)) == before  # nothing written


def test_a_nanogpt_file_without_its_weights_names_the_missing_key(tmp_path):
    save_like_nanogpt(nanogpt(), tmp_path / "ckpt.pt")
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    del ckpt["model"]  # model_args is there: the message said "(no 'model_args')"
    torch.save(ckpt, tmp_path / "ckpt.pt")
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path / "ckpt.pt")
    error = str(info.value)
    assert "not a whole nanoGPT checkpoint (it has 'model_args' but no 'model'" in error
    assert "no 'model_args'" not in error and "'model_args', 'iter_num'" in error and "\n" not in error


def test_text_on_a_nanogpt_file_without_meta_pkl_asks_for_its_tokenizer(tmp_path, capsys):
    """The probe said "put the series' vocab.json beside the .pt file": nanoGPT has a meta.pkl."""
    from probes import entropy

    save_like_nanogpt(nanogpt(), tmp_path / "ckpt.pt", dataset="elsewhere")
    for argv in (["--text", "ROMEO"], []):  # given text, and the shipped text by default
        assert entropy.main(["--ckpt", str(tmp_path / "ckpt.pt"), *argv]) == 2
        error = capsys.readouterr().err.strip()
        assert "\n" not in error and "--tokenizer PATH/meta.pkl" in error and "vocab.json" not in error, error


@pytest.mark.parametrize("change, message", [
    ({"n_embd": 64}, r"tensor 'transformer\.wte\.weight' has shape \[65, 32\] but model_args \(.*n_embd=64.*\) imply \[65, 64\]"),
    ({"n_layer": 3}, r"tensor 'transformer\.h\.2\.attn\.c_attn\.weight' is missing .*model_args \(n_layer=3"),
    ({"n_layer": 1}, r"unexpected tensor 'transformer\.h\.1\.ln_1\.weight'"),
    ({"bias": False}, r"unexpected tensor 'transformer\.h\.0\.ln_1\.bias'"),
    ({"n_head": 5}, r"n_embd=32 is not divisible by n_head=5"),
])
def test_model_args_that_disagree_with_the_weights(tmp_path, change, message):
    save_like_nanogpt(nanogpt(), tmp_path / "ckpt.pt")
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    ckpt["model_args"].update(change)
    torch.save(ckpt, tmp_path / "ckpt.pt")
    with pytest.raises(CheckpointError, match=message) as info:
        load_checkpoint(tmp_path / "ckpt.pt")
    assert "\n" not in str(info.value)


class Payload:
    """Unpickling it would write a file: the refusals below must never get that far."""

    def __init__(self, target: str):
        self.target = target

    def __reduce__(self):
        return (Path.write_text, (Path(self.target), "pwned"))


def test_nanogpt_file_that_needs_unpickling_is_refused_unread(tmp_path):
    save_like_nanogpt(nanogpt(), tmp_path / "ckpt.pt")
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    ckpt["config"]["callback"] = Payload(str(tmp_path / "pwned.txt"))
    torch.save(ckpt, tmp_path / "ckpt.pt")
    error = cli_error("--ckpt", str(tmp_path / "ckpt.pt"))
    assert "cannot load with torch.load(weights_only=True)" in error and "pickled objects are refused" in error
    assert not (tmp_path / "pwned.txt").exists()


def test_meta_pkl_that_names_a_callable_is_refused_unrun(tmp_path):
    save_like_nanogpt(nanogpt(), tmp_path / "ckpt.pt")
    with open(tmp_path / "meta.pkl", "wb") as f:
        pickle.dump({"itos": Payload(str(tmp_path / "pwned.txt"))}, f)
    with pytest.raises(CheckpointError, match=r"meta\.pkl: cannot read nanoGPT's vocabulary: refusing pathlib"):
        load_checkpoint(tmp_path / "ckpt.pt")
    assert not (tmp_path / "pwned.txt").exists()
