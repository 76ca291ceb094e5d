"""Tuned lens: a translator learns the identity where the model does nothing more, the shipped
lens of shakespeare_gpt beats the logit lens at every layer but the last, seeded training is
deterministic, save/load are exact inverses beside the snapshot (run readers unaffected), and a
lens for another model, an MLP-family model or a broken file is one line and exit 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from llama_kit import llama, llama_tokens  # noqa: F401  (fixture: a bias-free Llama-family bridge)

from models import build_model, get_preset
from models.checkpoint import list_snapshots, load_checkpoint, save_snapshot
from models.store.run import is_run_dir, latest_snapshot
from models.tokenizers import CharTokenizer
from probes import logit_lens, tuned_lens
from probes.common import ProbeInputError, sample_windows
from probes.lens.tuned_file import has_lens, lens_paths
from probes.tuned_lens import TunedLens, fit, training_batches

REPO = Path(__file__).resolve().parent.parent
GPT = REPO / "checkpoints" / "shakespeare_gpt"
TEXT = "the quick brown fox jumps over the lazy dog, then the dog sleeps. " * 40


def identity_after_layer_1(seed: int = 0) -> torch.nn.Module:
    """3 blocks, block 2 writes nothing (its attention and MLP outputs are zero): the residual
    after block 1 is the final residual, so translator 1 should be the identity."""
    torch.manual_seed(seed)
    model = build_model(get_preset("tiny_shakespeare_gpt_small", n_layers=3, dropout=0.0)).eval()
    with torch.no_grad():
        for name in ("attention.W_O", "attention.b_O", "mlp.net.2.weight", "mlp.net.2.bias"):
            model.get_parameter(f"blocks.2.{name}").zero_()
    return model


def random_ids(n: int = 4000, vocab: int = 65, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def layer_kl(model, lens, tokens) -> list[float]:
    return logit_lens.run(model, tokens, lens=lens).kl_to_final


def test_translator_of_the_layer_before_an_identity_block_learns_the_identity():
    model = identity_after_layer_1()
    torch.manual_seed(0)
    start = TunedLens(model)
    with torch.no_grad():  # start translator 1 away from the identity, so it has to learn it
        start.weight[2] += 0.3 * torch.randn(32, 32)
        start.bias[2] += 0.3 * torch.randn(32)
    test_tokens = random_ids(seed=7)[:512].view(32, 16)
    before = layer_kl(model, start, test_tokens)
    assert start.labels == ["embed", "0_post", "1_post", "2_post"]
    assert before[2] > 0.01  # the perturbation is visible
    fit(start, training_batches(random_ids(), 16, 16, seed=0), steps=300, lr=0.1)
    after = layer_kl(model, start, test_tokens)
    assert after[2] < 1e-4, after
    assert after[3] == pytest.approx(0.0, abs=1e-6)  # the last point is the model's own readout
    assert after[0] < before[0] and after[1] < before[1]


def test_identity_initialised_translators_start_as_the_logit_lens():
    model = identity_after_layer_1()
    tokens = random_ids()[:256].view(16, 16)
    tuned, plain = logit_lens.run(model, tokens, lens=TunedLens(model)), logit_lens.run(model, tokens)
    torch.testing.assert_close(torch.tensor(tuned.kl_to_final), torch.tensor(plain.kl_to_final), atol=1e-6, rtol=0)


def test_a_tuned_lens_on_a_bias_free_rmsnorm_bridge(llama):  # noqa: F811
    """Identity translators read as the logit lens (RMSNorm with gains, no bias, recomputed per
    layer); a few steps of fitting lower every translated layer's KL; the last point is the model."""
    tokens = llama_tokens(8, 16, seed=1)
    lens = TunedLens(llama)
    plain = logit_lens.run(llama, tokens)
    tuned = logit_lens.run(llama, tokens, lens=lens)
    torch.testing.assert_close(torch.tensor(tuned.kl_to_final), torch.tensor(plain.kl_to_final), atol=1e-6, rtol=1e-5)
    fit(lens, iter([tokens] * 30), steps=30, lr=1e-2, progress=False)
    after = logit_lens.run(llama, tokens, lens=lens).kl_to_final
    assert all(a < b for a, b in zip(after[:-1], plain.kl_to_final[:-1])), (after, plain.kl_to_final)
    assert after[-1] == pytest.approx(0.0, abs=1e-5)


def test_training_is_deterministic_with_a_seed(tmp_path):
    snap = load_checkpoint(save_snapshot(tmp_path / "s", identity_after_layer_1(), CharTokenizer.from_text(TEXT)))
    corpus = tuned_lens.Corpus(Path("t"), "x", random_ids(), random_ids(seed=2))
    lenses = [tuned_lens.train_and_save(snap, corpus, 5, batch_size=4, seed=s, path=tmp_path / f"{i}.safetensors")
              for i, s in enumerate((3, 3, 4))]
    assert torch.equal(lenses[0].weight, lenses[1].weight) and torch.equal(lenses[0].bias, lenses[1].bias)
    assert not torch.equal(lenses[0].weight, lenses[2].weight)
    assert (tmp_path / "0.safetensors").read_bytes() == (tmp_path / "1.safetensors").read_bytes()


# ---------------------------------------------------------------- the shipped lens

@pytest.fixture(scope="module")
def gpt():
    return load_checkpoint(GPT)


def test_shipped_tuned_lens_beats_the_logit_lens_on_shakespeare_gpt(gpt):
    assert has_lens(latest_snapshot(GPT)), "the shipped run should carry its tuned lens"
    lens = tuned_lens.load(gpt)
    corpus = tuned_lens.read_corpus(gpt, None)  # run.json's data: data/tinyshakespeare.txt
    windows = sample_windows(corpus.val.tolist(), 64, 16, seed=1)  # held-out text
    result = tuned_lens.compare(gpt.model, lens, windows)
    logit, tuned = result.logit.kl_to_final, result.tuned.kl_to_final
    assert result.logit.layers == ["embed", "0_post", "1_post", "2_post", "3_post"]
    assert all(t < l for t, l in zip(tuned[:-1], logit[:-1])), (logit, tuned)
    assert logit[-1] == pytest.approx(0.0, abs=1e-5) and tuned[-1] == pytest.approx(0.0, abs=1e-5)
    meta = json.loads(lens_paths(latest_snapshot(GPT))[1].read_text())
    assert meta["data"]["path"] == "data/tinyshakespeare.txt" and meta["d_model"] == 192


def test_the_run_readers_do_not_see_the_lens_files(gpt):
    snapshot = latest_snapshot(GPT)
    assert [p.name for p in list_snapshots(GPT)] == ["step_001500"] and is_run_dir(GPT)
    # the snapshot holds its own files and the pages' first view; the lens lives beside it, not in it
    assert sorted(p.name for p in snapshot.iterdir()) == ["config.json", "first_view.safetensors",
                                                         "model.safetensors", "vocab.json"]
    from app.data import discover
    assert [s.path.name for s in discover([GPT.parent]) if s.path.name.startswith("shakespeare_gpt")] == \
        ["shakespeare_gpt"]


# ---------------------------------------------------------------- files and bad input

@pytest.fixture
def run(tmp_path) -> Path:
    """A run directory with one small snapshot and a run.json recording its text."""
    run = tmp_path / "run"
    (tmp_path / "text.txt").write_text(TEXT)
    save_snapshot(run / "step_000010", identity_after_layer_1(), CharTokenizer.from_text(TEXT), step=10)
    (run / "run.json").write_text(json.dumps({"data": {"path": str(tmp_path / "text.txt")}}))
    return run


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = tuned_lens.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_trains_beside_the_snapshot_and_eval_reads_it_back(run, capsys):
    code, out, err = cli(capsys, "--ckpt", run, "--steps", 3, "--batch-size", 4, "--samples", 4, "--json")
    assert code == 0, err
    tensors, record = lens_paths(run / "step_000010")
    assert tensors.is_file() and record.is_file() and tensors.parent == run
    assert [p.name for p in list_snapshots(run)] == ["step_000010"]
    trained = json.loads(out)
    assert trained["layers"] == ["embed", "0_post", "1_post", "2_post"] and trained["trained"]["steps"] == 3
    meta = json.loads(record.read_text())
    assert {"model_config_sha256", "weights_sha256", "n_layers", "d_model", "steps", "seed", "data"} <= set(meta)
    code, out, err = cli(capsys, "--ckpt", run, "--eval", "--samples", 4, "--json")
    assert code == 0, err
    assert json.loads(out)["tuned_lens"] == trained["tuned_lens"]  # the same windows, the saved lens
    snap = load_checkpoint(run)
    lens = tuned_lens.load(snap)
    tokens = random_ids()[:64].view(4, 16)
    torch.testing.assert_close(layer_kl(snap.model, lens, tokens), layer_kl(snap.model, lens, tokens))


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_a_lens_for_another_model_is_one_line_and_exit_2(run, tmp_path, capsys):
    assert cli(capsys, "--ckpt", run, "--steps", 2, "--batch-size", 2, "--samples", 2)[0] == 0
    tensors, record = lens_paths(run / "step_000010")
    # another architecture: 2 layers of d_model 32
    other = tmp_path / "other"
    save_snapshot(other, build_model(get_preset("tiny_shakespeare_gpt_small", n_layers=2)),
                  CharTokenizer.from_text(TEXT))
    for src, dst in zip((tensors, record), lens_paths(other)):
        shutil.copy(src, dst)
    code, _, err = cli(capsys, "--ckpt", other, "--eval", "--data", tmp_path / "text.txt")
    assert code == 2 and "another model" in one_error_line(err) and "2 layers of d_model 32" in err
    # same shapes, another config (GELU instead of ReLU): the config hash differs
    gelu = tmp_path / "gelu"
    save_snapshot(gelu, build_model(get_preset("tiny_shakespeare_gpt_small", n_layers=3, dropout=0.0,
                                               act_fn="gelu")), CharTokenizer.from_text(TEXT))
    for src, dst in zip((tensors, record), lens_paths(gelu)):
        shutil.copy(src, dst)
    code, _, err = cli(capsys, "--ckpt", gelu, "--eval", "--data", tmp_path / "text.txt")
    assert code == 2 and "model config sha256" in one_error_line(err)
    # same config, other weights (a retrained snapshot)
    save_snapshot(run / "step_000010", identity_after_layer_1(seed=5), CharTokenizer.from_text(TEXT), step=10)
    code, _, err = cli(capsys, "--ckpt", run, "--eval")
    assert code == 2 and "weights sha256" in one_error_line(err)


def test_broken_or_missing_lens_files_are_one_line(run, capsys):
    code, _, err = cli(capsys, "--ckpt", run, "--eval")
    assert code == 2 and "no tuned lens" in one_error_line(err)
    assert cli(capsys, "--ckpt", run, "--steps", 1, "--batch-size", 2, "--samples", 2)[0] == 0
    tensors, _ = lens_paths(run / "step_000010")
    tensors.write_bytes(tensors.read_bytes()[:-8])
    code, _, err = cli(capsys, "--ckpt", run, "--eval")
    assert code == 2 and "sha256 differs" in one_error_line(err)
    code, _, err = cli(capsys, "--ckpt", run, "--eval", "--lens", run / "x.bin")
    assert code == 2 and ".safetensors" in one_error_line(err)


def test_a_saved_lens_is_replaced_only_with_force(run, tmp_path, capsys):
    """Training again beside a snapshot silently overwrote its lens (the shipped run's is tracked
    by git): now refused before any training, unless --force; --lens saves elsewhere, folders made."""
    small = ("--batch-size", 2, "--samples", 2)
    assert cli(capsys, "--ckpt", run, "--steps", 1, *small)[0] == 0
    tensors, record = lens_paths(run / "step_000010")
    saved = tensors.read_bytes(), record.read_bytes()
    code, _, err = cli(capsys, "--ckpt", run, "--steps", 3, "--seed", 1, *small)
    assert code == 2 and "a tuned lens is already there: give --force" in one_error_line(err)
    assert (tensors.read_bytes(), record.read_bytes()) == saved
    elsewhere = tmp_path / "new" / "folder" / "lens.safetensors"
    assert cli(capsys, "--ckpt", run, "--steps", 3, "--seed", 1, "--lens", elsewhere, *small)[0] == 0
    assert elsewhere.is_file() and elsewhere.with_suffix(".json").is_file()
    assert cli(capsys, "--ckpt", run, "--steps", 3, "--seed", 1, "--force", *small)[0] == 0
    assert tensors.read_bytes() == elsewhere.read_bytes() and json.loads(record.read_text())["steps"] == 3


def test_an_mlp_family_model_is_one_line_and_exit_2(tmp_path, capsys):
    snap = save_snapshot(tmp_path / "mlp", build_model(get_preset("char_mlp_small")), CharTokenizer.from_text(TEXT))
    (tmp_path / "text.txt").write_text(TEXT)
    code, _, err = cli(capsys, "--ckpt", snap, "--steps", 2, "--data", tmp_path / "text.txt")
    assert code == 2 and "transformer" in one_error_line(err)
    with pytest.raises(ProbeInputError, match="no residual stream"):
        TunedLens(load_checkpoint(snap).model)


def test_no_recorded_data_asks_for_data(tmp_path, capsys):
    snap = save_snapshot(tmp_path / "lone", identity_after_layer_1(), CharTokenizer.from_text(TEXT))
    code, _, err = cli(capsys, "--ckpt", snap, "--steps", 2)
    assert code == 2 and "--data" in one_error_line(err)
