"""--ckpt on Hugging Face causal-LM directories of other architectures than GPT-2 (Llama with
grouped kv heads, Qwen2, GPT-NeoX), read through TransformerBridge: every number checked against
the same weights loaded by transformers itself with eager attention (output_attentions=True,
output_hidden_states=True), which nobody here wrote."""

from __future__ import annotations

import json
import logging
import sys

import pytest
import torch
from hf_dir_kit import TEXT, save_hf_dir

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

KINDS = ("llama", "qwen2", "gpt_neox")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    made = {kind: save_hf_dir(root / kind, kind) for kind in KINDS}
    made["bare"] = save_hf_dir(root / "bare", "llama", tokenizer=False)
    return made


def eager(path):
    """The reference: transformers' own model on the same files, eager attention."""
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True,
                                                              attn_implementation="eager")
    return model.eval()


def text_ids(path) -> torch.Tensor:
    tok = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    return torch.tensor([tok.encode(TEXT, add_special_tokens=False)])  # [1 pos]


def run_cli(module, argv, capsys) -> dict:
    assert module.main(argv) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("kind", KINDS)
def test_entropy_cli_equals_eager_attention(dirs, kind, capsys):
    from probes import entropy

    got = run_cli(entropy, ["--ckpt", str(dirs[kind]), "--text", TEXT[:60], "--json"], capsys)
    ids = text_ids(dirs[kind])[:, :got["tokens"]]
    with torch.no_grad():
        patterns = eager(dirs[kind])(ids, output_attentions=True).attentions  # per layer [batch head q k]
    want = [(-(p * (p + 1e-10).log()).sum(-1)).mean(dim=(0, 2)) for p in patterns]
    assert got["tokens"] == len(transformers.AutoTokenizer.from_pretrained(str(dirs[kind])).encode(
        TEXT[:60], add_special_tokens=False))
    assert torch.allclose(torch.tensor(got["entropy"], dtype=torch.float64), torch.stack(want).double(), atol=1e-5)
    assert max(max(row) for row in got["entropy"]) < 0.9 * torch.tensor(got["tokens"]).log().item()  # not uniform


@pytest.mark.parametrize("kind", ("llama", "qwen2"))
def test_logit_lens_reads_each_layer_through_the_final_norm_and_head(dirs, kind):
    from models.checkpoint import load_checkpoint
    from probes import logit_lens

    snap = load_checkpoint(dirs[kind])
    ids = text_ids(dirs[kind])[:, :40]
    result = logit_lens.run(snap.model, ids)
    hf = eager(dirs[kind])
    with torch.no_grad():
        hidden = hf(ids, output_hidden_states=True).hidden_states  # embed, block 0 (the last is normed)
        logits = [hf.lm_head(hf.model.norm(h)) for h in hidden[:-1]] + [hf(ids).logits]
    want = [torch.nn.functional.cross_entropy(l[0, :-1], ids[0, 1:]).item() for l in logits]
    assert result.layers == ["embed", "0_post", "1_post"]
    assert result.cross_entropy == pytest.approx(want, abs=1e-4)
    assert result.readout_error < 1e-4


@pytest.mark.parametrize("kind", ("llama", "qwen2"))
def test_neighbours_of_the_unembedding_are_the_lm_heads_cosines(dirs, kind):
    from models.checkpoint import load_checkpoint
    from probes import neighbours

    snap = load_checkpoint(dirs[kind])
    got = neighbours.run(snap.model, 70, k=3, table="output").to_dict()["neighbours"]
    head = eager(dirs[kind]).lm_head.weight.detach()  # [vocab d_model]
    cos = torch.nn.functional.cosine_similarity(head[70][None], head, dim=-1)
    cos[70] = -2  # self excluded
    top = cos.topk(3)
    assert [n["id"] for n in got] == top.indices.tolist()
    assert [n["cosine"] for n in got] == pytest.approx(top.values.tolist(), abs=1e-5)


def test_the_snapshot_is_a_bridge_with_its_own_tokenizer_and_shape(dirs):
    from transformer_lens import TransformerBridge

    from models.checkpoint import load_checkpoint

    snap = load_checkpoint(dirs["llama"])
    hf = eager(dirs["llama"])
    assert isinstance(snap.model, TransformerBridge) and not snap.model.training
    assert (snap.config.architecture, snap.config.n_heads, snap.config.n_kv_heads) == ("llama", 4, 2)
    assert snap.config.n_params == sum(p.numel() for p in hf.parameters())
    assert snap.encode(TEXT).tolist() == text_ids(dirs["llama"]).tolist() and snap.decode(snap.encode(TEXT)) == TEXT
    assert snap.model.tokenizer is not snap.tokenizer  # the bridge keeps Hugging Face's for to_tokens
    with torch.no_grad():
        ids = snap.encode(TEXT)[:, :32]
        assert torch.allclose(snap.model(ids), hf(ids).logits, atol=1e-5)


def test_peek_and_models_info_describe_it(dirs, capsys):
    from models import info
    from models.store.peek import peek

    held = peek(dirs["qwen2"])
    n_params = sum(p.numel() for p in eager(dirs["qwen2"]).parameters())  # tied: lm_head counted once
    assert held["format"] == "Hugging Face model" and held["model"]["n_params"] == n_params
    got = run_cli(info, ["--ckpt", str(dirs["qwen2"]), "--json"], capsys)
    assert got["n_params"] == n_params and got["config"]["n_kv_heads"] == 2
    assert got["hooks"]["blocks.1.attn.hook_pattern"] == [1, 4, 8, 8]


def test_without_a_tokenizer_token_ids_only_said_once(dirs, caplog, capsys):
    from models.checkpoint import load_checkpoint
    from probes import entropy

    with caplog.at_level(logging.WARNING):
        snap = load_checkpoint(dirs["bare"])
    said = [r for r in caplog.records if "token ids only" in r.getMessage()]
    assert snap.tokenizer is None and snap.model.tokenizer is None and len(said) == 1
    assert entropy.run(snap.model, torch.tensor([[1, 2, 3, 4]])).tokens == 4
    assert entropy.main(["--ckpt", str(dirs["bare"]), "--text", "ROMEO"]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: bare has no tokenizer") and "tokenizer.save_pretrained(DIR)" in error


def test_without_transformers_one_line_says_what_to_install(dirs, monkeypatch):
    from models.checkpoint import CheckpointError, load_checkpoint

    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    with pytest.raises(CheckpointError, match=r"needs the transformers package: pip install transformers"):
        load_checkpoint(dirs["llama"])


def test_missing_weights_are_one_line_naming_the_directory(dirs, tmp_path, capsys):
    from probes import entropy

    (tmp_path / "config.json").write_bytes((dirs["llama"] / "config.json").read_bytes())
    assert entropy.main(["--ckpt", str(tmp_path), "--text", "ROMEO"]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and error.startswith(f"error: {tmp_path}: transformers cannot load it"), error


def test_the_doctor_reads_a_trainer_checkpoint_folder_holding_the_model(dirs, tmp_path, capsys):
    import shutil

    from probes import diagnose

    folder = shutil.copytree(dirs["llama"], tmp_path / "out" / "checkpoint-40")
    history = [{"loss": 5.0 - 0.05 * s, "grad_norm": 1.0, "learning_rate": 1e-3, "step": s} for s in range(5, 41, 5)]
    transformers.TrainerState(max_steps=40, global_step=40, logging_steps=5,
                              log_history=history).save_to_json(str(folder / "trainer_state.json"))
    assert diagnose.main(["--ckpt", str(folder), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["verdict"] == "healthy" and got["last_step"] == 40
