"""One rule for a flag that names what the run already fixes: refused, naming the flag, what the
run holds and what to do; repeating the run's own value is accepted. On --resume (where the user
may believe the change took effect): --preset, --set, --tokenizer, --bpe-vocab; for a probe:
--preset / --config with a checkpoint that carries its own config. (--resume --set and a probe's
--preset warned and carried on; --resume --bpe-vocab was ignored without a word.)"""

from __future__ import annotations

import shutil

import pytest

from test_faults import data, error_line, snap_dir, train  # noqa: F401 (data, snap_dir: fixtures)


@pytest.fixture(scope="module")
def run(data, tmp_path_factory):  # noqa: F811 (the imported fixture)
    out = tmp_path_factory.mktemp("fixed") / "run"
    assert train(data, out, "--steps", "2", "--save-every", "2") == 0
    return out


FIXES = "would change what the run fixes"
LEAVE = "; leave {flag} out to continue it, or train a new run with another --out"


@pytest.mark.parametrize("flags, message", [
    (["--set", "n_layers=1"], f"--resume: --set n_layers=1 {FIXES} (its model has n_layers=4)" + LEAVE.format(flag="--set")),
    (["--set", "n_ctx=16", "--set", "attn_scale=none"], f"--set attn_scale=none {FIXES} (its model has attn_scale=sqrt_d_model)"),
    (["--preset", "transformer4_rms"], f"--resume: --preset transformer4_rms {FIXES} (it was trained as preset "
                                       "transformer4_rms_small)" + LEAVE.format(flag="--preset")),
    (["--tokenizer", "bpe"], f"--resume: --tokenizer bpe {FIXES} (the char tokenizer)"),
    (["--bpe-vocab", "300"], f"--resume: --bpe-vocab 300 {FIXES} (the char tokenizer of "),
])
def test_resume_refuses_every_flag_the_run_fixes(data, run, capsys, flags, message):  # noqa: F811
    before = sorted(p.name for p in run.iterdir())
    assert train(data, run, "--resume", "--steps", "4", *flags) == 2
    assert message in error_line(capsys)
    assert sorted(p.name for p in run.iterdir()) == before  # refused before anything was written


def test_resume_accepts_the_runs_own_values(data, run, tmp_path):  # noqa: F811
    out = shutil.copytree(run, tmp_path / "run")
    assert train(data, out, "--resume", "--steps", "4", "--preset", "transformer4_rms_small",
                 "--set", "n_layers=4", "--tokenizer", "char") == 0


def test_bpe_vocab_without_a_bpe_tokenizer_is_refused(data, tmp_path, capsys):  # noqa: F811
    assert train(data, tmp_path / "run", "--bpe-vocab", "300") == 2
    assert error_line(capsys).startswith("error: --bpe-vocab 300 applies to --tokenizer bpe only (this run's is char)")


@pytest.mark.parametrize("kind", ["snapshot", "run"])
def test_a_probes_preset_or_config_with_a_checkpoint_carrying_its_own_config_is_refused(
        kind, snap_dir, tmp_path, capsys):  # noqa: F811
    from probes import entropy

    ckpt = snap_dir
    if kind == "run":
        ckpt = tmp_path / "run"
        ckpt.mkdir()
        (ckpt / "step_000003").symlink_to(snap_dir)
    assert entropy.main(["--ckpt", str(ckpt), "--preset", "gpt2_124m", "--text", "abc"]) == 2
    assert error_line(capsys) == (f"error: --preset gpt2_124m: {kind} {ckpt} carries its own model config; "
                                  "leave --preset out (--preset describes a series .pt state dict)")
    assert entropy.main(["--ckpt", str(ckpt), "--config", "cfg.json", "--text", "abc"]) == 2
    assert "error: --config cfg.json: " in error_line(capsys)


def test_a_probe_accepts_the_preset_the_run_records(data, run, capsys):  # noqa: F811
    from probes import entropy

    assert entropy.main(["--ckpt", str(run), "--preset", "transformer4_rms_small", "--text", "the king"]) == 0
