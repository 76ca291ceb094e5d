"""The landing view on every format `load_checkpoint` reads (issue 29, item 13): our run and
snapshot, a folder of numbered nanoGPT checkpoints, a nanoGPT out_dir's ckpt.pt, a Hugging Face
GPT-2 directory and a typed series .pt with its preset, each listed with the model its loader
builds, whole numbers as integers; and a checkpoint without its tokenizer says what to do in the
app (no CLI flag), which a reload then picks up."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
from app_kit import open_app
from nanogpt_ref import GPT, GPTConfig, save_like_nanogpt, write_meta_pkl

from models.store import list_snapshots, load_checkpoint
from models.store.peek import peek

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "checkpoints"
CHARS = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
NANO_STEPS = (1000, 2000, 3000, 4000)


def hf_directory(where: Path) -> Path | None:
    """save_pretrained's GPT-2 directory with its own tokenizer files, or None without transformers."""
    try:
        import tokenizers
        import transformers
    except ImportError:
        return None
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(["But soft, what light through yonder window breaks? " * 3], vocab_size=270,
                            min_frequency=1, show_progress=False, special_tokens=["<|endoftext|>"])
    where.mkdir()
    bpe.save_model(str(where))
    eot = bpe.token_to_id("<|endoftext|>")
    cfg = transformers.GPT2Config(vocab_size=bpe.get_vocab_size(), n_positions=32, n_embd=32, n_layer=3,
                                  n_head=2, bos_token_id=eot, eos_token_id=eot)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(where)
    return where


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[str, Path]:
    """runs/ holding one folder of each kind (the HF one when transformers is installed), and a
    series .pt outside it, typed in the sidebar with its preset."""
    from models import build_model, get_preset

    runs = tmp_path_factory.mktemp("runs")
    (runs / "nano").mkdir()
    for step in NANO_STEPS:
        torch.manual_seed(step)
        save_like_nanogpt(GPT(GPTConfig(block_size=32)).eval(), runs / "nano" / f"ckpt_{step:06d}.pt", iter_num=step)
    write_meta_pkl(runs / "nano" / "meta.pkl", CHARS)
    (runs / "out").mkdir()  # nanoGPT's out_dir, its meta.pkl not found (dataset elsewhere)
    save_like_nanogpt(GPT(GPTConfig(n_layer=3)).eval(), runs / "out" / "ckpt.pt", iter_num=500, dataset="elsewhere")
    shutil.copytree(SHIPPED / "char_mlp", runs / "ours")
    shutil.copytree(SHIPPED / "mha4" / "step_000500", runs / "snap")
    found = {name: runs / name for name in ("nano", "out", "ours", "snap")}
    if hf_directory(runs / "hf") is not None:
        found["hf"] = runs / "hf"
    series = tmp_path_factory.mktemp("series") / "model.pt"
    torch.save(build_model(get_preset("char_mlp")).state_dict(), series)
    return {"runs": runs, "series": series, **found}


def start(roots: dict[str, Path], monkeypatch, **query: str):
    return open_app(monkeypatch, [roots["runs"]], **query)


def loaded_config(path: Path, preset: str | None = None) -> dict:
    return load_checkpoint(path, preset=preset).config.to_dict()


@pytest.mark.parametrize("name", ["nano", "out", "ours", "snap", "hf"])
def test_peek_reads_the_config_the_loader_builds(roots, name):
    if name not in roots:
        pytest.skip("transformers is not installed")
    latest = list_snapshots(roots[name])[-1] if name in ("nano", "ours") else roots[name]
    assert peek(latest)["model"] == loaded_config(roots[name])
    assert peek(roots["series"], "char_mlp")["model"] == loaded_config(roots["series"], "char_mlp")


def test_every_format_is_listed_with_its_model_and_whole_numbers(roots, monkeypatch):
    from app.catalog import describe

    at = start(roots, monkeypatch)
    at.sidebar.text_input(key="typed_path").set_value(str(roots["series"]))
    at.sidebar.text_input(key="typed_preset").set_value("char_mlp")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    table = at.dataframe[0].value.set_index("run")
    assert not table["state"].str.startswith("unreadable").any(), table["state"].to_dict()
    for column in ("steps", "snapshots"):
        assert pd.api.types.is_integer_dtype(table[column]), (column, table[column].dtype)
    expected = {name: describe(None, loaded_config(roots[name]))
                for name in ("nano", "out", "snap", "hf") if name in roots}
    expected["ours"] = describe("char_mlp", loaded_config(roots["ours"]))
    expected["model.pt"] = describe("char_mlp", loaded_config(roots["series"], "char_mlp"))
    assert table["model"].to_dict() == expected
    assert table.loc["nano", "snapshots"] == len(NANO_STEPS) and table.loc["nano", "steps"] == NANO_STEPS[-1]
    assert table.loc["out", "steps"] == load_checkpoint(roots["out"]).step
    assert table.loc["nano", "doctor"] == "-" and table.loc["nano", "state"] == "nanoGPT checkpoints, no metrics"


def test_a_missing_tokenizer_is_told_in_the_apps_words_and_a_reload_reads_it(roots, monkeypatch):
    at = start(roots, monkeypatch, run="out")
    for page in ("overview", "attention", "embeddings"):
        at.switch_page(f"views/{page}.py").run()
        said = " ".join(e.value for e in at.error)
        assert "meta.pkl" in said and "then reload the page" in said and "--tokenizer" not in said, (page, said)
    write_meta_pkl(roots["out"] / "meta.pkl", CHARS)
    try:
        at.run()
        assert not at.error, [e.value for e in at.error]
    finally:
        (roots["out"] / "meta.pkl").unlink()
