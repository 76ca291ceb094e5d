"""With no --text, --text-file or --data a probe reads the checkpoint's own text (probes.run_text):
the run's recorded data, split as training split it, seeded windows from the validation split;
a checkpoint that records none reads data/tinyshakespeare.txt when its tokenizer can encode it;
the text used is named in one line and in --json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from models import build_model, get_preset
from models.checkpoint import load_checkpoint, save_snapshot
from models.tokenizers import CharTokenizer
from probes import activations, attribution, entropy, tuned_lens, updates
from probes.common import ProbeInputError, default_windows, sample_windows
from probes.run_text import NO_INPUT, validation_split

REPO = Path(__file__).resolve().parent.parent
GPT = REPO / "checkpoints" / "shakespeare_gpt"
SHAKESPEARE = (REPO / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8")


def lone_snapshot(path: Path, text: str = SHAKESPEARE) -> Path:
    """A snapshot outside any run (no run.json), with a character tokenizer of `text`."""
    tokenizer = CharTokenizer.from_text(text)
    cfg = get_preset("tiny_shakespeare_gpt_small", d_vocab=tokenizer.vocab_size, n_layers=1, n_ctx=16)
    torch.manual_seed(0)
    return save_snapshot(path, build_model(cfg), tokenizer)


def cli(main, capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_runs_windows_are_seeded_samples_of_its_validation_split():
    """By hand: the whole recorded file encoded, its last 10% (run.json: val_fraction 0.1), then
    the seeded windows sample_windows draws from it."""
    snap = load_checkpoint(GPT)
    ids = snap.tokenizer.encode(SHAKESPEARE)
    val = ids[len(ids) - round(len(ids) * 0.1):]
    windows, source = default_windows(snap, snap.tokenizer, 64, 8, 3)  # [8 64]
    assert torch.equal(windows, sample_windows(val, 64, 8, 3))
    assert source == ("8 random windows of 64 tokens (seed 3) from the validation split (last 10%) of "
                      "data/tinyshakespeare.txt (the run's data)")
    assert validation_split([1, 2, 3], 0.0) == [1, 2, 3] and validation_split(list(range(10)), 0.2) == [8, 9]


def test_entropy_on_the_shipped_run_with_no_text_reads_its_data(capsys):
    code, out, err = cli(entropy.main, capsys, "--ckpt", GPT, "--samples", 4, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["source"].startswith("4 random windows of 64 tokens (seed 0) from the validation split")
    assert result["source"].endswith("of data/tinyshakespeare.txt (the run's data)")
    snap = load_checkpoint(GPT)
    windows, _ = default_windows(snap, snap.tokenizer, 64, 4, 0)
    assert result["entropy"] == entropy.run(snap.model, windows).to_dict()["entropy"]
    code, out, _ = cli(entropy.main, capsys, "--ckpt", GPT, "--samples", 4)
    assert code == 0 and "(the run's data)" in out.splitlines()[1]


def test_a_lone_snapshot_reads_the_shipped_text(tmp_path, capsys):
    snap = lone_snapshot(tmp_path / "lone")
    code, out, err = cli(activations.main, capsys, "--ckpt", snap, "--samples", 2, "--json")
    assert code == 0, err
    assert json.loads(out)["source"].endswith("data/tinyshakespeare.txt (the shipped text: this "
                                              "checkpoint records no data)")
    code, out, err = cli(attribution.main, capsys, "--ckpt", snap, "--json")
    result = json.loads(out)
    assert code == 0 and len(result["tokens"]) == 16 and result["source"].startswith("1 random window of 16")
    assert result["total"] == pytest.approx(result["logit"], rel=1e-4, abs=1e-4)
    code, out, err = cli(updates.main, capsys, "--ckpt", snap, "--json")  # not a run: a step on its text
    assert code == 0 and "(the shipped text" in json.loads(out)["text"], err
    corpus = tuned_lens.read_corpus(load_checkpoint(snap), None)
    assert corpus.origin == "shipped" and corpus.path.name == "tinyshakespeare.txt"


def test_a_tokenizer_that_cannot_read_the_shipped_text_gives_the_old_message(tmp_path, capsys):
    snap = lone_snapshot(tmp_path / "abc", "abc ")
    code, _, err = cli(entropy.main, capsys, "--ckpt", snap)
    line = err.strip()
    assert code == 2 and "\n" not in line and line.startswith(f"error: {NO_INPUT} (this checkpoint records no data")
    with pytest.raises(ProbeInputError, match=NO_INPUT):
        default_windows(None, None, 16, 1, 0)  # a model given without its checkpoint
