"""python -m probes.patching and python -m probes.ablate on the shipped shakespeare_gpt: the JSON is
the runner's to_dict, the table prints, and bad input is one line with exit 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from close import assert_close_to_scale

from probes import ablate
from probes.patching.cli import main as patching_main

GPT = str(Path(__file__).resolve().parent.parent / "checkpoints" / "shakespeare_gpt")
PAIR = ["--clean", "the king", "--corrupt", "the kine"]


def test_patching_json_and_table(capsys):
    assert patching_main(["--ckpt", GPT, *PAIR, "--answer", " ", "--what", "resid", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["axes"] == ["layer", "pos"] and len(out["patched"]) == 4 and len(out["patched"][0]) == 8
    assert out["metric"] == "logprob" and out["direction"] == "denoise"
    assert out["patched"][0][-1] == pytest.approx(out["clean"], abs=1e-4 * abs(out["clean"]))  # the last char itself
    assert patching_main(["--ckpt", GPT, *PAIR, "--answer", " ", "--wrong", "e", "--noise"]) == 0
    printed = capsys.readouterr().out
    assert "exact patching (noise) of heads by position" in printed and "L3H5" in printed


@pytest.mark.parametrize("argv, words", [
    (["--clean", "the king", "--corrupt", "the kin", "--answer", " "], "differ in shape"),
    (["--clean", "the king", "--corrupt", "the kine", "--answer", "ab"], "not one"),
    (["--clean", "", "--corrupt", "the kine", "--answer", " "], "empty"),
    (["--clean", "the king", "--corrupt", "the kine", "--answer", "\u00e9"], "\u00e9"),
])
def test_patching_bad_input_is_one_line_exit_2(argv, words, capsys):
    assert patching_main(["--ckpt", GPT, *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and words in err


def test_a_model_without_heads_is_refused_in_one_line(capsys):
    mlp = str(Path(GPT).parent / "char_mlp")
    assert patching_main(["--ckpt", mlp, *PAIR, "--answer", " "]) == 2
    assert ablate.main(["--ckpt", mlp, "--heads", "0.0"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all("no attention heads" in line for line in err)


def test_ablate_cli(capsys):
    assert ablate.main(["--ckpt", GPT, "--heads", "1.0,1.2", "--repeat", "--samples", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [e["head"] for e in out["each"]] == [[1, 0], [1, 2]] and len(out["per_token"]) == 2
    assert ablate.main(["--ckpt", GPT, "--heads", "3.9", "--text", "the king"]) == 2
    assert "outside this model's 4 layers x 6 heads" in capsys.readouterr().err


def test_a_snapshot_of_any_model_patches_with_its_code_and_says_how_without(tmp_path, capsys):
    """The Monitor's snapshot of a user's per-head GPT: without --model-code one line naming it; with
    it, the CLI's numbers are run() on the trained module's own weights."""
    from test_any_snapshot import CHARS, USER_CODE, VOCAB, train

    from models.store.model_code import build
    from probes.patching import run
    code = tmp_path / "mygpt.py"
    code.write_text(f"MARK = {str(tmp_path / 'imported.txt')!r}\n" + USER_CODE)
    torch.manual_seed(0)
    model = train(build(f"{code}:TinyGPT", {"vocab": VOCAB}), tmp_path / "run", tokenizer=CHARS)
    argv = ["--ckpt", str(tmp_path / "run"), "--clean", "abcab", "--corrupt", "abdab", "--answer", "c", "--json"]
    assert patching_main(argv) == 2
    assert "--model-code path/to/your_file.py:TinyGPT" in capsys.readouterr().err
    assert patching_main([*argv, "--model-code", f"{code}:TinyGPT"]) == 0
    out = json.loads(capsys.readouterr().out)
    expected = run(model, "abcab", "abdab", answer="c", tokenizer=CHARS)
    assert_close_to_scale(torch.tensor(out["patched"]), expected.patched)
    assert float(expected.patched.std()) > 1e-4  # the heads differ: the comparison means something


def test_the_torch_free_parsers_offer_what_the_runners_take():
    from probes import patching_args
    from probes.patching import cells, runner
    assert (patching_args.WHATS, patching_args.METHODS, patching_args.HOWS) == (cells.WHATS, runner.METHODS, ablate.HOWS)
