"""The probes' shared input handling: windowing, sampling, dims, and the exit-2 convention."""

import argparse
import json
import math

import pytest
import torch

from models import build_model, get_preset
from models.cli import run_cli
from probes import common
from probes.sources import source_of


class _Chars:
    """A stand-in tokenizer over a fixed alphabet (the real one lives in models.tokenizers)."""

    def __init__(self, alphabet: str):
        self.alphabet = alphabet

    def encode(self, text):
        return [self.alphabet.index(c) for c in text]


def test_windows_split_long_ids_into_context_sized_pieces():
    chunks = common.windows(list(range(10)), 4)
    assert [c.tolist() for c in chunks] == [[[0, 1, 2, 3]], [[4, 5, 6, 7]], [[8, 9]]]


def test_batches_group_equal_lengths_and_respect_batch_size():
    chunks = common.windows(list(range(10)), 2) + common.windows([7], 2)
    batches = list(common.batches_of_windows(chunks, batch_size=2))
    assert [tuple(b.shape) for b in batches] == [(2, 2), (2, 2), (1, 2), (1, 1)]
    assert torch.cat([b.flatten() for b in batches]).tolist() == list(range(10)) + [7]


def test_sample_windows_are_real_slices_and_reproducible():
    ids = list(range(100))
    a = common.sample_windows(ids, 8, samples=5, seed=3)
    b = common.sample_windows(ids, 8, samples=5, seed=3)
    assert torch.equal(a, b) and a.shape == (5, 8)
    for row in a.tolist():  # consecutive ids: each window is a contiguous slice
        assert row == list(range(row[0], row[0] + 8))


def test_sample_windows_refuses_short_data():
    with pytest.raises(common.ProbeInputError, match="fewer than one context"):
        common.sample_windows([1, 2, 3], 8, samples=2)


def test_encode_text_rejects_empty_text_and_missing_tokenizer():
    with pytest.raises(common.ProbeInputError, match="empty"):
        common.encode_text(_Chars("ab"), "")
    with pytest.raises(common.ProbeInputError, match="no tokenizer"):
        common.encode_text(None, "ab")


def test_token_batches_from_text_windows_to_context():
    parser = argparse.ArgumentParser()
    common.add_input_arguments(parser)
    args = parser.parse_args(["--text", "abcabcab", "--batch-size", "4"])
    batches, source = common.token_batches(args, _Chars("abc"), n_ctx=3)
    assert [b.tolist() for b in batches] == [[[0, 1, 2], [0, 1, 2]], [[0, 1]]]
    assert "3 window(s)" in source


def test_attention_source_dims_and_layer_head_ranges():
    model = build_model(get_preset("transformer2_small"))
    attn = source_of(model)
    assert (attn.dims.n_layers, attn.dims.n_heads, attn.dims.n_ctx) == (2, 4, 16) and attn.windows == {}
    with pytest.raises(common.ProbeInputError, match=r"layer 2 is out of range.*0\.\.1"):
        attn.check(2, None)
    with pytest.raises(common.ProbeInputError, match=r"head -1 is out of range"):
        attn.check(0, -1)
    with pytest.raises(common.ProbeInputError, match="no attention"):
        source_of(build_model(get_preset("char_mlp_small")))


def test_to_jsonable_turns_tensors_and_nan_into_json():
    data = {"x": torch.tensor([[1.0, float("nan")]]), 0: (math.inf, 2)}
    assert json.loads(json.dumps(common.to_jsonable(data))) == {"x": [[1.0, None]], "0": [None, 2]}


def test_run_cli_turns_value_errors_into_one_line_and_exit_2(capsys):
    def body():
        raise ValueError("token id 99 is outside the vocabulary [0, 65)\nsecond line")

    assert run_cli(body) == 2
    err = capsys.readouterr().err
    assert err == "error: token id 99 is outside the vocabulary [0, 65)\n"
    assert run_cli(lambda: None) == 0


def test_unreadable_text_file_and_bad_batch_size_are_input_errors(tmp_path):
    with pytest.raises(common.ProbeInputError, match="cannot read text file"):
        common.read_text_file(tmp_path)  # a directory
    with pytest.raises(common.ProbeInputError, match="batch size must be >= 1, got 0"):
        common.as_batches(torch.tensor([[1, 2]]), n_ctx=4, d_vocab=8, batch_size=0)


@pytest.mark.parametrize("training", [True, False])
def test_eval_mode_turns_dropout_off_inside_and_leaves_the_mode_as_it_was(training, monkeypatch):
    from probes import attribution, heads

    model = build_model(get_preset("tiny_shakespeare_gpt_small", d_vocab=20)).train(training)
    calls = []
    original = type(model).train
    monkeypatch.setattr(type(model), "train", lambda self, mode=True: calls.append(mode) or original(self, mode))
    with common.eval_mode(model):
        assert not model.training and all(not m.training for m in model.modules())
    assert model.training is training
    assert calls == ([False, True] if training else [])  # an eval-mode model is not walked at all
    tokens = torch.randint(0, 20, (2, 8))
    heads.run(model, tokens, copying=False)
    attribution.run(model, tokens[:1])
    assert model.training is training
