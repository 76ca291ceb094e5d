"""A Hugging Face GPT-2 directory loads as our model: logits equal to GPT2LMHeadModel's forward,
the same tokenization as its own tokenizer, and other architectures or broken files refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from close import assert_close_to_scale

from models.checkpoint import CheckpointError, load_checkpoint

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

REPO = Path(__file__).resolve().parents[1]
TEXT = "ROMEO: But soft, what light through yonder window breaks? It is the east.\n" * 4


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> tuple[Path, object, object]:
    """A tiny random GPT2LMHeadModel and a byte-level BPE trained here, both save_pretrained'ed."""
    out = tmp_path_factory.mktemp("hf_gpt2")
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator([TEXT], vocab_size=300, min_frequency=1, show_progress=False)
    bpe.save_model(str(out))  # vocab.json + merges.txt, as GPT-2 ships them
    tok = transformers.GPT2Tokenizer.from_pretrained(str(out))  # a local directory: nothing fetched
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=320, n_positions=24, n_embd=32, n_layer=2, n_head=4,
                                   bos_token_id=300, eos_token_id=300)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # LayerNorms and biases random too, so every map shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out, model, tok


def test_hf_gpt2_gives_its_logits_and_tokenization(hf_dir):
    out, model, tok = hf_dir
    assert (out / "model.safetensors").is_file() and json.loads((out / "config.json").read_text())["model_type"] == "gpt2"
    snap = load_checkpoint(out)
    ids = tok(TEXT[:60])["input_ids"]
    assert snap.encode(TEXT[:60])[0].tolist() == ids and len(ids) < 60  # merges were applied
    assert snap.decode(ids) == TEXT[:60]
    every = tok(TEXT)["input_ids"]
    tokens = torch.tensor([every[:24], every[1:25]])  # [batch pos]
    with torch.no_grad():
        want = model(tokens).logits  # [batch pos vocab]
        assert_close_to_scale(snap.model(tokens), want)
        logits, cache = snap.model.run_with_cache(tokens)  # the explicit path, hooks firing
    assert_close_to_scale(logits, want)
    assert cache["blocks.0.mlp.hook_post"].shape == (2, 24, 128)
    cfg = snap.config
    assert (cfg.act_fn, cfg.unembed, cfg.attn_bias, cfg.norm_bias) == ("gelu_tanh", "tied", True, True)
    assert snap.meta["source"] == "huggingface" and snap.tokenizer.kind == "gpt2"


def test_vocab_and_merges_alone_tokenize_the_same(hf_dir, tmp_path):
    out, _, tok = hf_dir
    for name in ("config.json", "model.safetensors", "vocab.json", "merges.txt"):
        (tmp_path / name).write_bytes((out / name).read_bytes())
    snap = load_checkpoint(tmp_path)
    assert snap.encode(TEXT)[0].tolist() == tok(TEXT)["input_ids"]


def test_pytorch_model_bin_loads_and_a_snapshot_of_it_round_trips(hf_dir, tmp_path):
    out, model, _ = hf_dir
    (tmp_path / "config.json").write_bytes((out / "config.json").read_bytes())
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")  # lm_head.weight included, tied
    snap = load_checkpoint(tmp_path, device="cpu")
    tokens = torch.randint(0, 320, (1, 24))
    with torch.no_grad():
        assert_close_to_scale(snap.model(tokens), model(tokens).logits)
    from models.checkpoint import save_snapshot
    save_snapshot(tmp_path / "ours", load_checkpoint(out).model, load_checkpoint(out).tokenizer)
    again = load_checkpoint(tmp_path / "ours")
    assert again.tokenizer.encode(TEXT) == load_checkpoint(out).tokenizer.encode(TEXT)
    with torch.no_grad():
        assert torch.equal(again.model(tokens), load_checkpoint(out).model(tokens))


def cli_error(ckpt: Path) -> str:
    proc = subprocess.run([sys.executable, "-m", "probes.entropy", "--ckpt", str(ckpt), "--text", "abc"],
                          cwd=REPO, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    return proc.stderr


def copy_model(hf_dir, to: Path, *tokenizer_files: str) -> Path:
    for name in ("config.json", "model.safetensors", *tokenizer_files):
        (to / name).write_bytes((hf_dir[0] / name).read_bytes())
    return to


def test_vocab_and_merges_alone_keep_endoftext_one_special_token(hf_dir, tmp_path):
    """transformers makes <|endoftext|> one token (here 300: the trained vocabulary lacks it; GPT-2's
    own vocab.json has it at 50256); the bare BPE made it five pieces of its characters."""
    _, _, tok = hf_dir
    snap = load_checkpoint(copy_model(hf_dir, tmp_path, "vocab.json", "merges.txt"))
    text = "ROMEO:<|endoftext|>But"
    assert snap.encode(text)[0].tolist() == tok(text)["input_ids"] and 300 in tok(text)["input_ids"]
    assert snap.tokenizer.vocab_size == len(tok) == 301 and snap.tokenizer.special_count == 1
    assert snap.decode(snap.encode(text)) == text


def test_a_tokenizer_of_another_size_is_refused_naming_both(hf_dir, tmp_path):
    one = tokenizers.Tokenizer(tokenizers.models.BPE(vocab={"a": 0}, merges=[]))
    one.save(str(tmp_path / "tokenizer.json"))  # 1 token beside a 320-id model: loaded without a word
    copy_model(hf_dir, tmp_path)
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: the tokenizer has 1 tokens \(0 special\) "
                                              r"but the model's vocabulary has 320: it is not this model's"):
        load_checkpoint(tmp_path)


def test_a_model_that_pads_its_vocabulary_is_warned_about_once(hf_dir, tmp_path, caplog):
    snap = load_checkpoint(copy_model(hf_dir, tmp_path, "vocab.json", "merges.txt"))  # 301 tokens, 320 ids
    warned = [r.getMessage() for r in caplog.records if "pads it" in r.getMessage()]
    assert len(warned) == 1 and "the tokenizer has 301 tokens and the model's vocabulary 320" in warned[0]
    assert "ids 301..319 are padding" in warned[0] and snap.tokenizer is not None


def test_text_on_a_directory_without_tokenizer_files_asks_for_gpt2s(hf_dir, tmp_path, capsys):
    from probes import entropy

    copy_model(hf_dir, tmp_path)
    assert entropy.main(["--ckpt", str(tmp_path), "--text", "ROMEO"]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "tokenizer.save_pretrained(DIR)" in error and "series" not in error, error


def test_another_architecture_goes_to_the_bridge_and_names_what_it_lacks(tmp_path):
    # read through TransformerBridge now (tests/test_store_bridge.py); a config without its
    # shape is one line naming the file, and nothing is written
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    before = sorted(os.listdir(tmp_path))
    assert (f"{tmp_path / 'config.json'}: no positive integer num_hidden_layers / n_layer / num_layers "
            "(model_type 'llama')") in cli_error(tmp_path)
    assert sorted(os.listdir(tmp_path)) == before


def test_truncated_safetensors_is_one_line(hf_dir, tmp_path):
    out, _, _ = hf_dir
    (tmp_path / "config.json").write_bytes((out / "config.json").read_bytes())
    data = (out / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    assert "model.safetensors: truncated or corrupt safetensors file" in cli_error(tmp_path)


def test_config_that_disagrees_with_the_weights(hf_dir, tmp_path):
    out, _, _ = hf_dir
    config = json.loads((out / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "n_layer": 3}))
    (tmp_path / "model.safetensors").write_bytes((out / "model.safetensors").read_bytes())
    with pytest.raises(CheckpointError, match=r"tensor 'transformer\.h\.2\.attn\.c_attn\.weight' is missing"):
        load_checkpoint(tmp_path)
