"""Hugging Face directories that are not what they say (issue 44's audit, in our own words): each
is one line from `python -m models.info --ckpt DIR` with exit 2, naming the file and what is wrong,
and nothing of transformers' own (its LOAD REPORT table) printed before it."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from hf_dir_kit import save_hf_dir

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return save_hf_dir(tmp_path_factory.mktemp("hf") / "llama", "llama", tokenizer=False)


def variant(llama: Path, where: Path, *, config=None, weights=None) -> Path:
    """A copy of the llama directory with its config.json and/or weights rewritten."""
    shutil.copytree(llama, where)
    if config is not None:
        data = json.loads((where / "config.json").read_text())
        (where / "config.json").write_text(json.dumps(config(data)))
    if weights is not None:
        from safetensors.torch import load_file, save_file

        save_file(weights(load_file(where / "model.safetensors")), where / "model.safetensors")
    return where


def without(data: dict, key: str) -> dict:
    return {k: v for k, v in data.items() if k != key}


def save_other(where: Path, kind: str) -> Path:
    """A tiny BertModel (an encoder) or T5 (encoder-decoder) saved by save_pretrained."""
    torch.manual_seed(0)
    if kind == "bert":
        config = transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                         intermediate_size=32, max_position_embeddings=32)
        transformers.BertModel(config).save_pretrained(where)
    else:
        config = transformers.T5Config(vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2)
        transformers.T5ForConditionalGeneration(config).save_pretrained(where)
    return where


def cases(llama: Path, root: Path) -> dict[str, tuple[Path, str]]:
    """name -> (directory, what its one line must say)."""
    index = root / "index"
    shutil.copytree(llama, index)
    (index / "model.safetensors").unlink()
    (index / "model.safetensors.index.json").write_text("{garbage")
    return {
        "no model_type": (variant(llama, root / "untyped", config=lambda d: without(d, "model_type")),
                          r"config\.json: a Hugging Face config without model_type"),
        "BertModel": (save_other(root / "bert", "bert"), r"config\.json: architectures \['BertModel'\].*not a causal"),
        "T5": (save_other(root / "t5", "t5"), r"config\.json: model_type 't5' is a seq2seq \(encoder-decoder\) model"),
        "int32 weights": (variant(llama, root / "int32", weights=lambda s: {k: v.to(torch.int32) for k, v in s.items()}),
                          r"model\.safetensors: 21 of 21 tensors are not floating point \(.* \(I32\)"),
        "config says 3 layers": (variant(llama, root / "three", config=lambda d: {**d, "num_hidden_layers": 3}),
                                 r"disagree: 9 weights the config expects are missing \(model\.layers\.2\."),
        "config says 1 layer": (variant(llama, root / "one", config=lambda d: {**d, "num_hidden_layers": 1}),
                                r"disagree: 9 weights the config has no place for \(model\.layers\.1\."),
        "a q_proj deleted": (variant(llama, root / "noq", weights=lambda s: without(
            s, "model.layers.0.self_attn.q_proj.weight")), r"missing \(model\.layers\.0\.self_attn\.q_proj\.weight\)"),
        "garbage index": (index, r"model\.safetensors\.index\.json: not valid JSON"),
        "a vocabulary of 10**9": (variant(llama, root / "huge", config=lambda d: {**d, "vocab_size": 10**9}),
                                  r"config\.json: vocab_size 1000000000 is larger than any dimension of its weights"),
        "10,000 layers": (variant(llama, root / "deep", config=lambda d: {**d, "num_hidden_layers": 10_000}),
                          r"config\.json: 10000 layers declared, but its weights number blocks up to 1: not built"),
    }


def test_each_bad_directory_is_one_line_and_exit_2(llama, tmp_path, capfd):
    from models import info

    table = cases(llama, tmp_path)
    capfd.readouterr()  # save_pretrained's own progress bars
    for name, (directory, said) in table.items():
        assert info.main(["--ckpt", str(directory)]) == 2, name
        out, err = capfd.readouterr()
        lines = [line for line in (out + err).splitlines() if line.strip()]
        assert len(lines) == 1 and "LOAD REPORT" not in err, (name, lines[:3])
        assert lines[0].startswith(f"error: {directory}") and re.search(said, lines[0]), (name, lines[0])


def test_the_same_errors_in_python_are_the_projects_own(llama, tmp_path):
    from models.checkpoint import CheckpointError, load_checkpoint
    from models.store.peek import peek

    three = variant(llama, tmp_path / "three", config=lambda d: {**d, "num_hidden_layers": 3})
    with pytest.raises(CheckpointError, match="weights the config expects are missing"):
        load_checkpoint(three)
    with pytest.raises(CheckpointError, match="seq2seq"):  # the app's run list reads the shape alone
        peek(save_other(tmp_path / "t5", "t5"))
    assert load_checkpoint(llama).config.n_layers == 2  # the untouched directory still loads


HOSTILE_CODE = "from pathlib import Path\nPath(__file__).with_name('RAN').write_text('the folder ran its code')\n"


def custom_code_folders(llama: Path, root: Path) -> dict[str, Path]:
    """Folders whose auto_map asks transformers to import hostile.py beside them, which writes RAN."""
    unknown = root / "unknown"
    unknown.mkdir()
    (unknown / "config.json").write_text(json.dumps({
        "model_type": "made_up_here", "architectures": ["MadeUpForCausalLM"], "num_hidden_layers": 2,
        "num_attention_heads": 4, "hidden_size": 32, "max_position_embeddings": 64, "vocab_size": 300,
        "auto_map": {"AutoConfig": "hostile.MadeUpConfig", "AutoModelForCausalLM": "hostile.MadeUpForCausalLM"}}))
    tokenizing = variant(llama, root / "tokenizing")
    (tokenizing / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "MadeUpTokenizer", "auto_map": {"AutoTokenizer": ["hostile.MadeUpTokenizer", None]}}))
    for folder in (unknown, tokenizing):
        (folder / "hostile.py").write_text(HOSTILE_CODE)
    return {"unknown model_type": unknown, "tokenizer auto_map": tokenizing}


def test_a_folder_naming_its_own_code_is_refused_and_nothing_runs(llama, tmp_path, capfd, monkeypatch):
    """transformers would ask "run the custom code? [y/N]" and run it on a y: a y waits on stdin here."""
    import io
    import sys

    from models import info

    monkeypatch.setattr(sys, "stdin", io.StringIO("y\ny\ny\n"))
    for name, folder in custom_code_folders(llama, tmp_path).items():
        capfd.readouterr()
        assert info.main(["--ckpt", str(folder)]) == 2, name
        lines = [line for line in "".join(capfd.readouterr()).splitlines() if line.strip()]
        assert len(lines) == 1 and "auto_map" in lines[0] and "hostile" in lines[0], (name, lines)
        assert not (folder / "RAN").exists(), name
