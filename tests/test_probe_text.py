"""Probes take text where a tokenizer is known (`tokenizer=` or `model.tokenizer`): the result
equals the probe on the ids the CLI's `--text` would give (`snap.encode(text)`, windowed to the
context for long text); unknown characters and a missing tokenizer are one-line errors."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from test_entropy import T, toy_model

from models.checkpoint import load_checkpoint
from models.tokenizers import CharTokenizer
from probes import activations, degenerate, entropy, logit_lens, neighbours
from probes.common import ProbeInputError

SHIPPED = Path(__file__).resolve().parents[1] / "checkpoints" / "shakespeare_rms4"
TEXT = "ROMEO: But soft, what light"


@pytest.fixture(scope="module")
def snap():
    return load_checkpoint(SHIPPED)


def long_text(snap) -> str:
    """2.5 contexts of Shakespeare-ish text: three windows, the last one short."""
    n = snap.config.n_ctx
    return ((TEXT + "\n") * n)[: 5 * n // 2]


def windowed(ids: list[int], n: int) -> list[torch.Tensor]:
    """The CLI's windowing written out: full n-token windows in one batch, then the rest."""
    full = len(ids) // n
    batches = [torch.tensor([ids[i * n:(i + 1) * n] for i in range(full)])]
    return batches + [torch.tensor([ids[full * n:]])] if len(ids) % n else batches


RUNNERS = {
    "entropy": lambda model, x, **kw: entropy.run(model, x, **kw).to_dict(),
    "degenerate": lambda model, x, **kw: degenerate.run(model, x, **kw).to_dict(),
    "logit_lens": lambda model, x, **kw: logit_lens.run(model, x, k=3, **kw).to_dict(),
    "activations": lambda model, x, **kw: activations.run(model, x, **kw).to_dict(),
}


@pytest.mark.parametrize("probe", sorted(RUNNERS))
def test_text_equals_the_encoded_ids_on_a_shipped_run(snap, probe):
    assert RUNNERS[probe](snap.model, TEXT) == RUNNERS[probe](snap.model, snap.encode(TEXT))


@pytest.mark.parametrize("probe", sorted(RUNNERS))
def test_long_text_is_windowed_as_the_cli_windows_it(snap, probe):
    text = long_text(snap)
    ids = snap.tokenizer.encode(text)
    n = 2 * snap.config.n_ctx if probe == "activations" else snap.config.n_ctx  # as each CLI cuts --text
    by_text = RUNNERS[probe](snap.model, text)
    assert by_text == RUNNERS[probe](snap.model, windowed(ids, n))
    if probe == "entropy":
        assert by_text["windows"] == 3


def test_neighbours_of_a_piece_use_the_models_tokenizer(snap):
    e = snap.tokenizer.piece_to_id("e")
    by_piece = neighbours.run(snap.model, "e").to_dict()
    assert by_piece == neighbours.run(snap.model, e, tokenizer=snap.tokenizer).to_dict()
    assert by_piece["query"] == {"id": e, "piece": "e"}


def test_a_word_is_not_a_piece_of_a_character_vocabulary(snap):
    with pytest.raises(ProbeInputError, match="' the' is not in the vocabulary.*single characters") as info:
        neighbours.run(snap.model, " the")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("probe", sorted(RUNNERS))
def test_unknown_character_is_a_one_line_error_naming_it(snap, probe):
    with pytest.raises(ProbeInputError, match="'\u00e9' at position 5 is not in the vocabulary") as info:
        RUNNERS[probe](snap.model, "ROMEO\u00e9")
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------- a hand-set toy model
# test_entropy's toy: W_Q = W_K = 0, so every head attends uniformly and row i (i + 1 keys) has
# entropy ln(i + 1); no tokenizer attached.


def test_toy_text_through_an_explicit_tokenizer_gives_the_paper_answer():
    tok = CharTokenizer(list("abcde"))
    model = toy_model()
    text = "abcdeabc"  # exactly one context
    by_text = entropy.run(model, text, tokenizer=tok)
    assert by_text.to_dict() == entropy.run(model, torch.tensor([tok.encode(text)])).to_dict()
    want = sum(math.log(i + 1) for i in range(T)) / T
    assert by_text.entropy == [[pytest.approx(want, abs=1e-6)] * 2]
    assert degenerate.run(model, text, tokenizer=tok).verdicts == [["uniform", "uniform"]]

    with torch.no_grad():  # a=e0, b=e1, c=e2, d=e0+0.1e1, e=e1+e2: d's nearest is a (cos 0.995)
        model.embedding.weight[:, :3] = torch.tensor([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 0.1, 0], [0, 1, 1]])
    near = neighbours.run(model, "d", tokenizer=tok, k=2)
    assert near.query == {"id": 3, "piece": "d"}
    assert [n["piece"] for n in near.neighbours] == ["a", "b"]
    assert near.neighbours[0]["cosine"] == pytest.approx(1 / math.sqrt(1.01), abs=1e-6)


@pytest.mark.parametrize("probe", sorted(RUNNERS))
def test_text_without_a_tokenizer_is_a_one_line_error(probe):
    with pytest.raises(ProbeInputError, match="Transformer has no tokenizer") as info:
        RUNNERS[probe](toy_model(), "abc")
    assert "\n" not in str(info.value)


def test_ids_still_work_unchanged():
    model = toy_model()
    tokens = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2]])  # [batch pos]
    assert entropy.run(model, tokens).to_dict() == entropy.run(model, [tokens]).to_dict()
