"""probes.entropy.layer_patterns (the app's small multiples): every head of a layer from one
forward pass, on tests/test_entropy.py's hand-set toy model where each pattern is known on paper,
and equal to head_pattern head by head on a trained-shape model."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from test_entropy import T, assert_grid, set_self_head, toy_model

from models import build_model, get_preset
from probes import entropy
from probes.common import ProbeInputError


def set_previous_head(model, layer: int, head: int) -> None:
    """W_Q = I, W_K = the shift: q_i . k_j = 30 [j == i - 1], so row i > 0 puts e^30 / (e^30 + i)
    on key i - 1 (one-hot to 1e-12) and row 0, with one key, is 1 there."""
    with torch.no_grad():
        h = model.blocks[layer].attention.heads[head]
        h.W_Q.copy_(torch.eye(T))
        h.W_K.copy_(torch.diag(torch.ones(T - 1), 1))  # k_j = sqrt(30) e_{j+1}: matches q_{j+1}


def test_a_layer_of_uniform_self_and_previous_token_heads_is_known_on_paper():
    model = toy_model(n_layers=2, n_heads=3)
    set_self_head(model, 1, 1)
    set_previous_head(model, 1, 2)
    ids = torch.zeros(1, T, dtype=torch.long)
    patterns = entropy.layer_patterns(model, ids, 1)  # [head q k]
    assert patterns.shape == (3, T, T) and patterns.dtype == torch.float64
    uniform = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1).unsqueeze(1)  # row i: 1/(i+1) on 0..i
    previous = torch.zeros(T, T)
    previous[0, 0] = 1.0
    previous[torch.arange(1, T), torch.arange(0, T - 1)] = 1.0
    assert_grid(patterns[0], uniform)
    assert_grid(patterns[1], torch.eye(T))
    assert_grid(patterns[2], previous)
    assert_grid(entropy.layer_patterns(model, ids, 0), uniform.expand(3, T, T))  # layer 0: W_Q = W_K = 0


def test_agrees_with_head_pattern_for_every_head_and_cuts_to_the_first_window():
    torch.manual_seed(0)
    model = build_model(get_preset("transformer4_rms_small")).eval()
    n_ctx = model.cfg.n_ctx
    ids = torch.randint(0, model.cfg.d_vocab, (1, n_ctx + 5))  # longer than the context
    for layer in range(model.cfg.n_layers):
        patterns = entropy.layer_patterns(model, ids, layer)
        assert patterns.shape == (model.cfg.n_heads, n_ctx, n_ctx)
        for head in range(model.cfg.n_heads):
            expected, _ = entropy.head_pattern(model, ids, layer, head)
            assert torch.equal(patterns[head], expected), (layer, head)
        assert patterns.sum(-1).sub(1).abs().max() < 1e-5  # every row a distribution
        assert torch.triu(patterns, 1).abs().max() == 0  # causal


def test_a_model_in_training_mode_is_measured_in_eval_mode_and_left_training():
    torch.manual_seed(0)
    model = build_model(replace(get_preset("transformer4_rms_small"), dropout=0.5)).train()
    ids = torch.randint(0, model.cfg.d_vocab, (1, 12))
    first = entropy.layer_patterns(model, ids, 1)
    assert torch.equal(first, entropy.layer_patterns(model, ids, 1)) and model.training


@pytest.mark.parametrize("layer", [-1, 2])
def test_a_layer_out_of_range_is_refused(layer):
    with pytest.raises(ProbeInputError, match="out of range"):
        entropy.layer_patterns(toy_model(n_layers=2), torch.zeros(1, T, dtype=torch.long), layer)


def test_row_entropy_of_the_uniform_head_is_ln_keys():
    patterns = entropy.layer_patterns(toy_model(), torch.zeros(1, T, dtype=torch.long), 0)
    assert_grid(entropy.attention_entropy(patterns[0]), [math.log(i + 1) for i in range(T)])
