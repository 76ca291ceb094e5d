"""The sweep's command line under bad input (issue 37: `--vary z_loss=0,-1` and `--steps 0` trained
the valid runs for 30 s, then exited 1): each is one line, exit 2, before any run starts and with
nothing written. tests/test_sweep.py holds the first cases; tests/test_sweep_damage.py the damaged
sweep.json files; tests/test_sweep_kill.py the processes."""

from __future__ import annotations

import pytest

from test_sweep import one_error_line, text_file  # noqa: F401  (the fixture)
from train.sweep.cli import main

BAD = {
    "nan_rate": ["--lr", "nan"],
    "inf_rate": ["--lr", "1e-3,inf"],
    "word_rate": ["--lr", "fast"],
    "steps_zero": ["--lr", "1e-3", "--steps", "0"],
    "negative_steps": ["--lr", "1e-3", "--steps", "-5"],
    "batch_size_zero": ["--lr", "1e-3", "--batch-size", "0"],
    "negative_warmup": ["--lr", "1e-3", "--warmup", "-5"],
    "vary_negative_z_loss": ["--lr", "1e-3", "--vary", "z_loss=0,-1"],
    "vary_momentum_one": ["--lr", "1e-3", "--optimizer", "sgd", "--vary", "momentum=0.5,1"],
    "vary_grad_clip_negative": ["--lr", "1e-3", "--vary", "grad_clip=1,-1"],
    "vary_without_values": ["--lr", "1e-3", "--vary", "qk_norm"],
    "vary_value_with_a_slash": ["--lr", "1e-3", "--vary", "qk_norm=none,a/b"],
    "vary_n_heads_not_a_number": ["--lr", "1e-3", "--vary", "n_heads=4,three"],
    "workers_zero": ["--lr", "1e-3", "--workers", "0"],
    "unknown_backend": ["--lr", "1e-3", "--backend", "slurm"],
    "missing_data": ["--lr", "1e-3", "--data", "no/such/file.txt"],
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_refused_before_any_run(case, text_file, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "sweep"
    argv = ["--preset", "transformer4_small", "--data", str(text_file), "--out", str(out), *BAD[case]]
    if "--data" in BAD[case]:
        argv = argv[:2] + argv[4:]  # the case's own --data
    assert main(argv) == 2
    one_error_line(capsys)
    assert not out.exists()


def test_an_out_that_is_a_file_or_holds_other_files_is_refused(text_file, tmp_path, capsys):  # noqa: F811
    common = ["--preset", "transformer4_small", "--data", str(text_file), "--lr", "1e-3"]
    (tmp_path / "a_file").write_text("mine")
    assert main([*common, "--out", str(tmp_path / "a_file")]) == 2
    assert "is not a folder" in one_error_line(capsys)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    assert main([*common, "--out", str(tmp_path / "busy")]) == 2
    assert "is not empty" in one_error_line(capsys)
    assert (tmp_path / "a_file").read_text() == "mine" and (tmp_path / "busy" / "notes.txt").read_text() == "mine"


def test_a_resume_of_a_folder_with_no_sweep_is_refused(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["--out", str(tmp_path / "empty"), "--resume"]) == 2
    assert "holds no sweep.json" in one_error_line(capsys)
    assert main(["--out", str(tmp_path / "missing"), "--resume"]) == 2
    one_error_line(capsys)
    assert not (tmp_path / "missing").exists()
