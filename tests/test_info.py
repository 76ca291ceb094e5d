"""python -m models.info: presets and checkpoints described, hooks listed with shapes."""

from __future__ import annotations

import json

import pytest

from models import PRESETS, get_preset
from models.checkpoint import load_checkpoint
from models.info import CHAR_ALPHABET, SHAKESPEARE_CHARS, char_tokenizer_for, main


def run_json(capsys, *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_preset_json_lists_hooks_with_shapes(capsys):
    info = run_json(capsys, "--preset", "transformer4_rms_small")
    cfg = get_preset("transformer4_rms_small")
    n = min(cfg.n_ctx, 8)
    assert info["name"] == "transformer4_rms_small" and info["family"] == "transformer"
    assert info["config"] == cfg.to_dict()
    assert info["dummy_input_shape"] == [1, n]
    hooks = info["hooks"]
    assert hooks["blocks.0.attn.hook_pattern"] == [1, 4, n, n]
    assert hooks["blocks.0.attn.hook_attn_scores"] == [1, 4, n, n]
    assert hooks["blocks.0.attn.hook_q"] == [1, n, 4, 8]
    assert hooks["blocks.0.attn.hook_result"] == [1, n, 4, 32]
    assert hooks["blocks.0.ln1.hook_scale"] == [1, n, 1]
    assert hooks["blocks.0.mlp.hook_pre"] == [1, n, 64]
    assert hooks["blocks.0.mlp.hook_pre_1"] == [1, n, 64]  # series MLP depth 2
    assert hooks["blocks.3.hook_resid_post"] == [1, n, 32]  # the twin keeps the 4 blocks
    assert "ln_final.hook_scale" not in hooks  # the series has no final norm
    # 96*32 embed + 16*32 pos + 32*96 unembed; per block: 4 heads * 3 * 32*8 + 32*32 W_O
    # + MLP 32*64+64 + 64*64+64 + 64*32+32 + 2 RMSNorm gammas of 32
    per_block = 4 * 3 * 32 * 8 + 32 * 32 + (32 * 64 + 64) + (64 * 64 + 64) + (64 * 32 + 32) + 64
    assert info["n_params"] == 96 * 32 + 16 * 32 + 32 * 96 + 4 * per_block


def test_mlp_preset_uses_a_full_window(capsys):
    info = run_json(capsys, "--preset", "char_mlp_small")
    assert info["dummy_input_shape"] == [1, 8]
    assert info["hooks"]["hook_window"] == [1, 1, 64]
    assert info["hooks"]["mlp.hook_pre"] == [1, 1, 64]


def test_text_output_and_no_hooks(capsys):
    assert main(["--preset", "attn1_noscale_small"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("attn1_noscale_small  (transformer, ")
    assert "blocks.0.attn.hook_pattern" in out and "attn_scale" in out
    info = run_json(capsys, "--preset", "attn1_noscale_small", "--no-hooks")
    assert "hooks" not in info


def test_list_presets(capsys):
    listed = run_json(capsys, "--list-presets")
    assert [p["name"] for p in listed] == list(PRESETS)
    assert {"name": "gpt2_124m", "family": "transformer",
            "description": PRESETS["gpt2_124m"].description} in listed


@pytest.mark.parametrize("argv, needle", [
    (["--preset", "no_such_preset"], "unknown preset 'no_such_preset'"),
    ([], "give --preset NAME or --ckpt PATH"),
    (["--ckpt", "/nonexistent/run"], "/nonexistent/run: not found"),
    (["--preset", "mha4", "--save", "unused"], "d_vocab=2048"),
    (["--preset", "mha4_small", "--seq-len", "17"], "longer than the model's context of 16"),
])
def test_errors_are_one_line_exit_2(capsys, tmp_path, argv, needle):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0]
    assert not (tmp_path / "unused").exists()


def test_save_then_ckpt_round_trip(capsys, tmp_path):
    target = tmp_path / "demo" / "step_000000"
    built = run_json(capsys, "--preset", "tiny_shakespeare_gpt_small", "--save", str(target))
    assert built["saved"] == str(target)
    loaded = run_json(capsys, "--ckpt", str(tmp_path / "demo"), "--device", "cpu")
    assert loaded["name"] == "demo/step_000000"
    assert loaded["hooks"] == built["hooks"]
    assert loaded["config"] == built["config"] and loaded["n_params"] == built["n_params"]
    assert loaded["tokenizer"] == {"kind": "char", "vocab_size": 65}
    assert loaded["step"] == 0 and loaded["nonfinite_params"] == []
    snap = load_checkpoint(target)
    assert "".join(snap.tokenizer.chars) == "".join(sorted(SHAKESPEARE_CHARS))
    assert snap.meta["train_config"]["preset"] == "tiny_shakespeare_gpt_small"


def test_save_refuses_an_existing_snapshot(capsys, tmp_path):
    target = tmp_path / "demo" / "step_000000"
    run_json(capsys, "--preset", "tiny_shakespeare_gpt_small", "--save", str(target))
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    assert main(["--preset", "tiny_shakespeare_gpt_small", "--seed", "1", "--save", str(target)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "already exists" in err[0]
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before  # the first model is kept


def test_char_alphabet():
    assert len(CHAR_ALPHABET) == len(set(CHAR_ALPHABET)) == 96
    assert CHAR_ALPHABET.startswith(SHAKESPEARE_CHARS) and len(SHAKESPEARE_CHARS) == 65
    assert char_tokenizer_for(96).vocab_size == 96
    with pytest.raises(ValueError, match="at most 96"):
        char_tokenizer_for(97)
