"""The app on models we read but never rebuild (AppTest): a Hugging Face Llama directory and
nanochat's dN folder are listed with what builds them and their parameter count, the model pages
open on the Llama directory (from --runs and typed into "Open a path"), and a nanochat checkpoint
says in one line what it needs where nanochat does not import."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from app_kit import open_app
from hf_dir_kit import save_hf_dir
from test_store_nanochat import CONTEXT, DEPTH, HEADS, WIDTH, nanochat_importable, nanochat_state, write_nanochat

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

PAGES = ["overview", "attention", "embeddings", "lens", "compare"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """runs/llama (save_pretrained's files and tokenizer) and runs/d2 (nanochat's, two steps)."""
    root = tmp_path_factory.mktemp("runs")
    save_hf_dir(root / "llama", "llama")
    base = tmp_path_factory.mktemp("nanochat")
    write_nanochat(base).rename(root / f"d{DEPTH}")
    return root


def test_the_run_list_names_what_builds_each_model_and_its_size(runs, monkeypatch):
    from app.catalog import params_text

    at = open_app(monkeypatch, [runs])
    table = at.dataframe[0].value.set_index("run")
    llama = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_pretrained(str(runs / "llama")).parameters())
    nanochat = sum(v.numel() for v in nanochat_state(20).values())
    assert table.loc["llama", "model"] == f"llama 2L×4H d32 · {params_text(llama)}"
    assert table.loc["d2", "model"] == f"nanochat {DEPTH}L×{HEADS}H d{WIDTH} · {params_text(nanochat)}"
    assert (table.loc["d2", "steps"], table.loc["d2", "snapshots"]) == (20, 2)
    assert table.loc["llama", "state"] == "Hugging Face model" and "None" not in " ".join(table["model"])
    assert params_text(131_126) == "131.1k params" and params_text(124_439_808) == "124.4M params"


def test_model_pages_open_on_a_hugging_face_llama_directory(runs, monkeypatch):
    at = open_app(monkeypatch, [runs / "llama"])  # `-- --runs DIR` on the directory itself
    assert at.sidebar.selectbox(key="run").value == "llama"
    for name in PAGES:
        at.switch_page(f"views/{name}.py").run()
        assert not at.exception, (name, [e.value for e in at.exception])
        assert not at.error, (name, [e.value for e in at.error])
    at.switch_page("views/overview.py").run()
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(runs / "llama"))
    n_params = sum(p.numel() for p in hf.parameters())
    shown = {m.label: m.value for m in at.metric}
    assert shown["parameters"] == f"{n_params:,}" and shown["tokenizer"] == "huggingface (300)", shown


def test_a_llama_directory_typed_into_open_a_path(runs, monkeypatch, tmp_path):
    at = open_app(monkeypatch, [tmp_path])  # nothing listed until it is typed
    at.sidebar.text_input(key="typed_path").set_value(str(runs / "llama"))
    at.run()
    at.sidebar.selectbox(key="run").set_value("llama")
    at.run()
    at.switch_page("views/attention.py").run()
    assert not at.exception and not at.error, [e.value for e in at.exception] + [e.value for e in at.error]


def test_a_nanochat_checkpoint_without_nanochat_says_what_to_install(runs, monkeypatch):
    for name in [m for m in sys.modules if m == "nanochat" or m.startswith("nanochat.")] + ["nanochat"]:
        monkeypatch.setitem(sys.modules, name, None)
    at = open_app(monkeypatch, [runs], run="d2")
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "model_000020.pt: a nanochat checkpoint is built with nanochat's own GPT" in errors[0] \
        and "pip install -e" in errors[0], errors
    assert CONTEXT == 16  # the shape the list shows is the meta file's (test above), not a built model's


@pytest.mark.skipif(not nanochat_importable(), reason="the nanochat package does not import")
def test_a_nanochat_checkpoint_opens_built_by_nanochat(runs, monkeypatch):
    at = open_app(monkeypatch, [runs], run="d2")
    shown = {m.label: m.value for m in at.metric}
    assert shown["parameters"] == f"{sum(v.numel() for v in nanochat_state(20).values()):,}" and shown["step"] == "20"
    # no tokenizer.pkl beside base_checkpoints/: the loader's own line, not "put vocab.json there"
    assert [e.value for e in at.error] == [f"d2/model_000020.pt has no tokenizer (token ids only): no nanochat "
                                           f"tokenizer at {runs.parent / 'tokenizer'} (nanochat's tok_train writes "
                                           "it there); then reload the page"]


def test_a_nanochat_model_file_typed_into_open_a_path_needs_no_preset(runs, monkeypatch, tmp_path):
    for name in [m for m in sys.modules if m == "nanochat" or m.startswith("nanochat.")] + ["nanochat"]:
        monkeypatch.setitem(sys.modules, name, None)
    at = open_app(monkeypatch, [tmp_path])
    at.sidebar.text_input(key="typed_path").set_value(str(runs / "d2" / "model_000010.pt"))
    at.run()
    assert "model_000010.pt" in at.sidebar.selectbox(key="run").options  # not "type its preset below"
    at.sidebar.selectbox(key="run").set_value("model_000010.pt")
    at.run()
    at.switch_page("views/overview.py").run()
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "model_000010.pt: a nanochat checkpoint is built with nanochat's own GPT" in errors[0]


@pytest.mark.skipif(not nanochat_importable(), reason="the nanochat package does not import")
def test_nanochats_model_pages_open_with_its_own_tokenizer(tmp_path, monkeypatch):
    import torch
    from test_nanochat_tokenizer import TOKENIZER_VOCAB, write_tokenizer

    pytest.importorskip("tiktoken")
    folder = write_nanochat(tmp_path, vocab=TOKENIZER_VOCAB)
    write_tokenizer(tmp_path)  # tmp_path/tokenizer/tokenizer.pkl, where nanochat keeps it
    at = open_app(monkeypatch, [folder], run="d2")
    for name in PAGES:
        at.switch_page(f"views/{name}.py").run()
        assert not at.exception and not at.error, (name, [e.value for e in at.exception] + [e.value for e in at.error])
    at.switch_page("views/embeddings.py").run()
    at.text_input(key="token").set_value(" the").run()
    at.selectbox(key="table").set_value("input").run()
    shown = at.dataframe[0].value
    rows = nanochat_state(20, TOKENIZER_VOCAB)["transformer.wte.weight"][:TOKENIZER_VOCAB]
    cos = torch.nn.functional.cosine_similarity(rows[259][None], rows, dim=-1)
    cos[259] = -2  # " the" itself
    assert shown["id"].tolist() == cos.topk(len(shown)).indices.tolist()
    at.switch_page("views/lens.py").run()
    assert any("decoded through its own final norm and unembedding" in i.value for i in at.info)
