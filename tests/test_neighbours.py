"""Embedding neighbours: planted near-duplicates come first with the cosines computed on paper,
the chunked all-vocabulary mode equals the per-token mode and a full-matrix reference, analogies,
the three tables on tied/untied models and a TransformerBridge, and the CLI's exit 2."""

from __future__ import annotations

import json
import math

import pytest
import torch
from llama_kit import llama  # noqa: F401  (fixture: a bias-free Llama-family bridge)

from models import TransformerConfig, build_model, get_preset
from models.checkpoint import save_snapshot
from models.tokenizers import CharTokenizer
from probes import neighbours
from probes.common import ProbeInputError
from probes.knn import GROUP, top_k_columns
from probes.neighbours import all_neighbours

TEXT = "the quick brown fox jumps over the lazy dog, then the dog sleeps."


def full_matrix(queries: torch.Tensor, keys: torch.Tensor, k: int, exclude_self: bool = True):
    """The straightforward reference: the whole [n m] cosine matrix, self masked, topk."""
    q = queries / queries.norm(dim=1, keepdim=True)
    kk = keys / keys.norm(dim=1, keepdim=True)
    sims = q @ kk.T
    if exclude_self:
        n = min(sims.shape)
        sims[range(n), range(n)] = -math.inf
    return sims.topk(k, dim=1)


def planted_table(n: int, d: int = 8, seed: int = 0) -> torch.Tensor:
    """Random rows in span(e2..e7) (cosine exactly 0 with e0 and e1), plus three planted rows:
    n - 1 -> 2 e0, 5 -> e0 + 0.1 e1, n - 3 -> e0 + e1 (cosines 1/sqrt(1.01), 1/sqrt 2 with 2 e0)."""
    gen = torch.Generator().manual_seed(seed)
    table = torch.zeros(n, d)
    table[:, 2:] = torch.randn(n, d - 2, generator=gen)
    table[[5, n - 3, n - 1]] = 0.0
    table[n - 1, 0] = 2.0
    table[5, 0], table[5, 1] = 1.0, 0.1
    table[n - 3, 0], table[n - 3, 1] = 1.0, 1.0
    return table


@pytest.mark.parametrize("n", [64, 1000])  # the plain topk path and the grouped one
def test_planted_near_duplicates_come_first_with_paper_cosines(n):
    table = planted_table(n)
    q = n - 1  # 2 e0
    values, ids = all_neighbours(table, k=4, chunk_size=300)
    assert ids[q, :2].tolist() == [5, n - 3]
    assert values[q].tolist() == pytest.approx([1 / math.sqrt(1.01), 1 / math.sqrt(2), 0.0, 0.0], abs=1e-6)
    assert ids[5, :2].tolist() == [q, n - 3]
    assert values[5, :2].tolist() == pytest.approx([1 / math.sqrt(1.01), 1.1 / math.sqrt(2.02)], abs=1e-6)


def test_runner_on_a_planted_model_embedding():
    cfg = TransformerConfig(d_vocab=1000, n_ctx=4, d_model=8, n_layers=1, n_heads=1, d_head=8, d_mlp=8)
    model = build_model(cfg)
    with torch.no_grad():
        model.embedding.weight.copy_(planted_table(1000))
    result = neighbours.run(model, 999, k=3)
    assert [n["id"] for n in result.neighbours[:2]] == [5, 997]
    assert result.neighbours[0]["cosine"] == pytest.approx(1 / math.sqrt(1.01), abs=1e-6)
    data = result.to_dict()
    assert data["query"] == {"id": 999, "piece": None} and set(data["neighbours"][0]) == {"id", "piece", "cosine"}


@pytest.mark.parametrize("table", ["input", "output", "cross"])
def test_all_vocabulary_mode_equals_per_token_mode(table):
    cfg = TransformerConfig(d_vocab=700, n_ctx=4, d_model=24, n_layers=1, n_heads=1, d_head=24, d_mlp=8)
    torch.manual_seed(0)
    model = build_model(cfg)
    every = neighbours.run_all(model, k=6, table=table, chunk_size=97)
    for i in range(0, 700, 7):
        one = neighbours.run(model, i, k=6, table=table)
        assert [n["id"] for n in one.neighbours] == every.ids[i].tolist()
        assert [n["cosine"] for n in one.neighbours] == pytest.approx(every.cosines[i].tolist(), abs=1e-6)
    queries, keys = neighbours.tables_for(model, table)
    ref_values, ref_ids = full_matrix(queries.detach(), keys.detach(), 6)
    assert torch.equal(every.ids, ref_ids)
    torch.testing.assert_close(every.cosines, ref_values, atol=1e-6, rtol=0)


def test_grouped_top_k_is_exact():
    gen = torch.Generator().manual_seed(3)
    sims = torch.randn(50, 10 * GROUP, generator=gen)
    sims[:, -17:] = -math.inf  # padding
    values, ids = top_k_columns(sims, 7, 10 * GROUP - 17)
    ref_values, ref_ids = sims.topk(7, dim=1)
    assert torch.equal(values, ref_values) and torch.equal(ids, ref_ids)


def test_chunk_size_does_not_change_the_answer():
    table = torch.randn(600, 16, generator=torch.Generator().manual_seed(1))
    a = all_neighbours(table, k=5, chunk_size=7)  # tiles of 7 rows: 7 does not divide 600
    b = all_neighbours(table, k=5, chunk_size=599)
    c = all_neighbours(table, k=5)
    assert torch.equal(a[1], b[1]) and torch.equal(b[1], c[1])


def test_analogy_excludes_its_terms_and_finds_the_planted_answer():
    cfg = TransformerConfig(d_vocab=30, n_ctx=4, d_model=8, n_layers=1, n_heads=1, d_head=8, d_mlp=8)
    model = build_model(cfg)
    table = planted_table(30)
    table[10], table[11], table[12] = torch.eye(8)[0] * 3, torch.eye(8)[1], torch.eye(8)[0] + torch.eye(8)[1]
    table[20] = torch.eye(8)[0] - torch.eye(8)[1] + torch.eye(8)[0] + torch.eye(8)[1]  # 2 e0: a - b + c
    with torch.no_grad():
        model.embedding.weight.copy_(table)
    # unit(a) - unit(b) + unit(c) = e0 - e1 + (e0 + e1)/sqrt2
    result = neighbours.run(model, analogy=(10, 11, 12), k=3)
    ids = [n["id"] for n in result.neighbours]
    assert not {10, 11, 12} & set(ids)
    v = torch.tensor([1 + 1 / math.sqrt(2), -1 + 1 / math.sqrt(2)])
    assert result.neighbours[0]["cosine"] == pytest.approx(float(v[0] / v.norm()), abs=1e-6)
    assert ids[0] in (20, 29)  # both are multiples of e0


def test_cross_table_on_tied_and_untied_models():
    tied = build_model(get_preset("gpt2_124m_small"))
    cross, same = neighbours.run(tied, 3, k=5, table="cross"), neighbours.run(tied, 3, k=5, table="input")
    assert cross.neighbours == same.neighbours and cross.self_cosine == pytest.approx(1.0)
    untied = build_model(get_preset("tiny_shakespeare_gpt_small"))
    with torch.no_grad():
        untied.W_out[:, 40] = untied.embedding.weight[7] * 5  # token 40's output = token 7's input
    cross = neighbours.run(untied, 7, k=3, table="cross")
    assert cross.neighbours[0]["id"] == 40 and cross.neighbours[0]["cosine"] == pytest.approx(1.0, abs=1e-6)
    assert 7 not in [n["id"] for n in cross.neighbours]


def test_transformer_bridge_tables():
    from transformer_lens import TransformerBridge
    bridge = TransformerBridge.boot_native({
        "n_layers": 1, "d_model": 16, "n_heads": 2, "d_head": 8, "d_mlp": 32, "d_vocab": 40,
        "n_ctx": 8, "act_fn": "gelu", "normalization_type": "LN", "seed": 0})
    for table, (q, k) in {"input": (bridge.W_E, bridge.W_E), "output": (bridge.W_U.T, bridge.W_U.T),
                          "cross": (bridge.W_E, bridge.W_U.T)}.items():
        result = neighbours.run(bridge, 4, k=5, table=table)
        ref_values, ref_ids = full_matrix(q.detach(), k.detach(), 5)
        assert [n["id"] for n in result.neighbours] == ref_ids[4].tolist()


def test_bias_free_bridge_tables(llama):  # noqa: F811
    for table, (q, k) in {"output": (llama.W_U.T, llama.W_U.T), "cross": (llama.W_E, llama.W_U.T)}.items():
        result = neighbours.run(llama, 4, k=5, table=table)
        _, ref_ids = full_matrix(q.detach(), k.detach(), 5)
        assert [n["id"] for n in result.neighbours] == ref_ids[4].tolist()


def test_mlp_family_has_only_an_input_table():
    model = build_model(get_preset("char_mlp_small"))
    assert len(neighbours.run(model, 0, k=3).neighbours) == 3
    for table in ("output", "cross"):
        with pytest.raises(ProbeInputError, match="no output embedding table"):
            neighbours.run(model, 0, table=table)


def test_diverged_table_and_bad_k_are_refused():
    model = build_model(get_preset("transformer4_rms_small"))
    vocab = model.cfg.d_vocab
    with pytest.raises(ProbeInputError, match=f"k must be between 1 and {vocab - 1}"):
        neighbours.run(model, 0, k=vocab)
    with torch.no_grad():
        model.embedding.weight[3, 0] = float("nan")
    with pytest.raises(ProbeInputError, match="1 NaN/inf"):
        neighbours.run(model, 0)
    with pytest.raises(ProbeInputError, match="NaN/inf"):
        neighbours.run(model, 3)  # the query row itself
    big = torch.randn(700, 8)
    big[650, 5] = float("inf")
    with pytest.raises(ProbeInputError, match="1 NaN/inf"):
        all_neighbours(big, k=3)


# ---------------------------------------------------------------- CLI

@pytest.fixture
def snapshot(tmp_path):
    def make(preset: str = "tiny_shakespeare_gpt_small"):
        tok = CharTokenizer.from_text(TEXT)
        torch.manual_seed(0)
        model = build_model(get_preset(preset, d_vocab=tok.vocab_size))
        return str(save_snapshot(tmp_path / preset, model, tok))
    return make


def test_cli_token_json(snapshot, capsys):
    assert neighbours.main(["--ckpt", snapshot(), "--token", "e", "-k", "4", "--table", "cross", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["query"]["piece"] == "e" and data["table"] == "cross" and "self_cosine" in data
    assert len(data["neighbours"]) == 4 and all(set(n) == {"id", "piece", "cosine"} for n in data["neighbours"])
    cos = [n["cosine"] for n in data["neighbours"]]
    assert cos == sorted(cos, reverse=True) and "e" not in [n["piece"] for n in data["neighbours"]]


def test_cli_human_all_and_analogy(snapshot, capsys):
    path = snapshot()
    assert neighbours.main(["--ckpt", path, "--id", "3", "-k", "2"]) == 0
    assert "nearest neighbours of" in capsys.readouterr().out
    assert neighbours.main(["--ckpt", path, "--analogy", "d", "o", "g", "-k", "2"]) == 0
    assert "'d' (id" in capsys.readouterr().out
    assert neighbours.main(["--ckpt", path, "--all", "-k", "2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["tokens"]) == len(set(TEXT)) and len(data["tokens"][0]["neighbours"]) == 2


@pytest.mark.parametrize("preset, args, message", [
    ("tiny_shakespeare_gpt_small", ["--token", "zz"], "piece 'zz' is not in the vocabulary"),
    ("tiny_shakespeare_gpt_small", ["--token", ""], "empty"),
    ("tiny_shakespeare_gpt_small", ["--id", "999"], "outside the vocabulary"),
    ("tiny_shakespeare_gpt_small", ["--id", "1", "-k", "0"], "k must be between"),
    ("attn1_noscale_small", ["--id", "1", "--table", "output"], "no unembedding matrix"),
    ("char_mlp_small", ["--id", "1", "--table", "cross"], "no output embedding table"),
])
def test_cli_bad_input_is_one_line_and_exit_2(snapshot, capsys, preset, args, message):
    assert neighbours.main(["--ckpt", snapshot(preset), *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("error: ") and message in captured.err
    assert captured.err.count("\n") == 1
