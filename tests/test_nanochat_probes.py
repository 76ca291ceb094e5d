"""The logit lens and the neighbour tables on models without hook points, read through their own
parts (models.anatomy): nanochat's layout written here in our words (`ChatGPT`, with recent
nanochat's backout), two tutorial GPTs, and nanochat's real GPT and tokenizer where they import.
References: the lens at the last layer is the model's own logits; every layer by hand through the
model's final norm, unembedding and softcap; neighbours are cosines over the model's own rows."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from gpt_kit import BatchedGPT, ChatGPT, PerHeadGPT, rms, tokens
from test_nanochat_tokenizer import TEXT, TOKENIZER_VOCAB, Marker, write_tokenizer
from test_store_nanochat import needs_nanochat, write_nanochat

from probes import logit_lens, neighbours


def by_hand(model: ChatGPT, ids: torch.Tensor) -> list[torch.Tensor]:
    """ChatGPT's residual stream entering block 0 and leaving each block, decoded as its forward
    decodes the last: backout from block n // 2 on, RMSNorm, lm_head, 15 tanh(z / 15)."""
    n = ids.shape[1]
    x = rms(model.transformer["wte"](ids))
    stream = [x]
    for block in model.transformer["h"]:
        x = block(x, model.cos[:, :n], model.sin[:, :n])
        stream.append(x)
    mid = len(model.transformer["h"]) // 2
    lam = model.backout_lambda
    stream = stream[:mid + 1] + [r - lam * stream[mid + 1] for r in stream[mid + 1:]]
    return [15 * torch.tanh(model.lm_head(rms(r)) / 15) for r in stream]


def test_the_lens_on_nanochats_layout_is_its_own_readout_at_every_layer():
    torch.manual_seed(0)
    model = ChatGPT(n_layers=4, backout=1.5).eval()  # lambda > 1: block 2 read with its sign flipped
    ids = tokens(2, 12)
    result = logit_lens.run(model, ids)
    with torch.no_grad():
        want = by_hand(model, ids)
        own = model(ids)
    assert result.layers == ["embed", "0_post", "1_post", "2_post", "3_post"]
    assert torch.allclose(want[-1], own, atol=1e-5) and result.readout_error < 1e-5
    ce = [F.cross_entropy(w[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).item() for w in want]
    assert result.cross_entropy == pytest.approx(ce, rel=1e-5)
    top = [w.softmax(-1).max(-1) for w in want]
    got = result.top_k()
    assert [[s[p][0]["id"] for s in layer for p in range(12)] for layer in got] == \
        [t.indices.flatten().tolist() for t in top]
    assert result.kl_to_final[-1] == pytest.approx(0.0, abs=1e-6) and min(result.kl_to_final[:-1]) > 1e-3


def test_the_lens_refuses_mid_block_points_and_the_tuned_lens_reads_it_through_its_parts():
    from probes import tuned_lens
    from probes.errors import ProbeInputError

    with pytest.raises(ProbeInputError, match=r"^ChatGPT has no hook point between attention and MLP"):
        logit_lens.LogitLens(ChatGPT(), include_mid=True)
    torch.manual_seed(0)
    model = ChatGPT().eval()
    ids = tokens(1, 12)
    lens = tuned_lens.TunedLens(model)  # identity translators: the logit lens, through nanochat's own parts
    assert lens.n_translators == model_layers(model) and lens.d_model == model.transformer["wte"].weight.shape[1]
    tuned, plain = logit_lens.run(model, ids, lens=lens), logit_lens.run(model, ids)
    assert tuned.kl_to_final == plain.kl_to_final and tuned.cross_entropy == plain.cross_entropy  # same code, same bits
    assert float(tuned_lens.kl_loss(lens, ids).detach()) == pytest.approx(sum(plain.kl_to_final[:-1]) / lens.n_translators,
                                                                  rel=1e-4)


def model_layers(model) -> int:
    return len(model.transformer["h"])


@pytest.mark.parametrize("make", [ChatGPT, PerHeadGPT, BatchedGPT])
def test_neighbours_are_cosines_over_the_models_own_rows(make):
    torch.manual_seed(1)
    model = make().eval()
    tables = {"ChatGPT": ("transformer.wte.weight", "lm_head.weight"), "PerHeadGPT": ("tok_emb.weight",
              "out_head.weight"), "BatchedGPT": ("token_embedding_table.weight", "lm_head.weight")}[make.__name__]
    weights = dict(model.named_parameters())
    for table, name in zip(("input", "output"), tables):
        rows = weights[name].detach()
        cos = F.cosine_similarity(rows[7][None], rows, dim=-1)
        cos[7] = -2  # self excluded
        got = neighbours.run(model, 7, k=4, table=table).to_dict()["neighbours"]
        assert [n["id"] for n in got] == cos.topk(4).indices.tolist(), (make.__name__, table)
        assert [n["cosine"] for n in got] == pytest.approx(cos.topk(4).values.tolist(), abs=1e-6)
    assert logit_lens.run(model, tokens(1, 10)).readout_error < 1e-5  # their readouts too


@pytest.fixture
def nanochat_run(tmp_path):
    """A nanochat base dir: its GPT's checkpoint (backout lambda 0.7) and a genuine tokenizer.pkl."""
    pytest.importorskip("tiktoken")
    folder = write_nanochat(tmp_path, steps=(30,), vocab=TOKENIZER_VOCAB)
    state = torch.load(folder / "model_000030.pt", weights_only=True)
    state["backout_lambda"] = torch.tensor([0.7])
    torch.save(state, folder / "model_000030.pt")
    write_tokenizer(tmp_path)
    return folder, state


@needs_nanochat
def test_nanochats_gpt_in_the_lens_and_neighbours_clis(nanochat_run, capsys):
    from models.checkpoint import load_checkpoint

    folder, state = nanochat_run
    assert neighbours.main(["--ckpt", str(folder), "--token", " the", "-k", "3", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    rows = state["transformer.wte.weight"][:TOKENIZER_VOCAB]  # its padded rows are no token's
    cos = F.cosine_similarity(rows[259][None], rows, dim=-1)
    cos[259] = -2
    assert got["query"] == {"id": 259, "piece": " the"} and [n["id"] for n in got["neighbours"]] == \
        cos.topk(3).indices.tolist()
    assert logit_lens.main(["--ckpt", str(folder), "--text", TEXT, "--json"]) == 0
    lens = json.loads(capsys.readouterr().out)
    snap = load_checkpoint(folder)
    ids = torch.tensor([snap.tokenizer.encode(TEXT)[:snap.config.n_ctx]])  # the first window
    with torch.no_grad():
        own = snap.model(ids)  # nanochat's own forward: backout, norm, lm_head, crop, softcap
    assert lens["readout_error"] < 1e-5 and lens["tokens"][0] == ids[0].tolist()
    want = F.cross_entropy(own[0, :-1], ids[0, 1:], reduction="none").tolist()
    assert lens["cross_entropy_per_position"][-1][0][:-1] == pytest.approx(want, rel=1e-5)


@needs_nanochat
def test_a_hostile_tokenizer_pkl_never_runs_in_the_clis(nanochat_run, tmp_path, capsys, caplog):
    import pickle

    from models import info
    from probes import entropy

    folder, _ = nanochat_run
    marker = tmp_path / "ran"
    (tmp_path / "tokenizer" / "tokenizer.pkl").write_bytes(pickle.dumps(Marker(marker)))
    assert info.main(["--ckpt", str(folder), "--json"]) == 0  # the model is read: token ids only
    assert entropy.main(["--ckpt", str(folder), "--text", "the cat"]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert not marker.exists() and "tokenizer.pkl: refused: it names 'builtins.exec'" in error
