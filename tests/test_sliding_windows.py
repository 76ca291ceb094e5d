"""Sliding windows judged against the window: a row of a sliding-window layer sees k_i = min(i + 1, w)
keys, so a head attending uniformly over them has normalised entropy 1 and reads "uniform", as it
does without a window (DESIGN.md, "Attention entropy"). Checked on paper, on transformers' own
Mistral (through the tap, and through a TransformerBridge whose windows come from the config) and
on a Gemma 2 whose layers alternate, and on what transformers' configs say per layer."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from gpt_kit import nanochat_gpt, tokens
from probes import degenerate, entropy
from probes.sources import source_of
from probes.sources.hooked import config_windows

transformers = pytest.importorskip("transformers")


def uniform_over_window(n: int, window: int) -> torch.Tensor:
    """[1 1 n n]: row i spread evenly over keys max(0, i - window + 1) .. i."""
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    seen = ((j <= i) & (j > i - window)).double()
    return (seen / seen.sum(-1, keepdim=True))[None, None]


def test_uniform_over_a_window_on_paper():
    n, w = 10, 4
    p = uniform_over_window(n, w)
    rows = entropy.attention_entropy(p)[0, 0]
    assert torch.allclose(rows, torch.tensor([math.log(min(i + 1, w)) for i in range(n)], dtype=torch.float64),
                          rtol=1e-9, atol=1e-8)
    assert torch.allclose(entropy.normalized_entropy(p, window=w), torch.ones(1, 1, n - 1, dtype=torch.float64))
    assert float(entropy.normalized_entropy(p)[0, 0, -1]) == pytest.approx(math.log(4) / math.log(10), rel=1e-6)
    assert bool(entropy.normalized_entropy(uniform_over_window(n, 1), window=1).isnan().all())


def silenced(model: torch.nn.Module) -> torch.nn.Module:
    """W_Q = 0 in every layer: every visible key scores the same, so each row is uniform over them."""
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.zero_()
    return model.eval()


def mistral(window: int | None) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.MistralConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                     sliding_window=window, attn_implementation="sdpa")
    return silenced(transformers.MistralForCausalLM(cfg))


def assert_uniform(model, ids: torch.Tensor, layers: int) -> None:
    got = entropy.run(model, ids)
    grid = torch.tensor(got.entropy_normalized, dtype=torch.float64)
    assert torch.allclose(grid, torch.ones(layers, 4, dtype=torch.float64), rtol=1e-6)
    assert degenerate.run(model, ids).verdicts == [["uniform"] * 4] * layers


@pytest.mark.parametrize("window", [4, None])
def test_mistral_uniform_over_its_window_reads_uniform_through_the_tap(window):
    model, ids = mistral(window), tokens(2, 16)
    assert source_of(model, ids).windows == ({0: 4} if window else {})
    assert_uniform(model, ids, 1)
    raw = entropy.run(model, ids).entropy[0][0]  # the raw entropy: the mean of ln(k_i) over rows
    assert raw == pytest.approx(sum(math.log(min(i + 1, window or 16)) for i in range(16)) / 16, rel=1e-6)


def test_mistral_through_a_bridge_takes_its_windows_from_the_config(tmp_path):
    from models.checkpoint import load_checkpoint
    mistral(4).save_pretrained(tmp_path)
    bridge = load_checkpoint(tmp_path).model
    attn = source_of(bridge)
    assert (attn.kind, attn.windows) == ("hooks", {0: 4})
    assert_uniform(bridge, tokens(2, 16), 1)


def test_gemma2_alternating_layers_each_against_its_own_keys():
    torch.manual_seed(0)
    cfg = transformers.Gemma2Config(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                    max_position_embeddings=64, sliding_window=4,
                                    layer_types=["sliding_attention", "full_attention"],
                                    attn_implementation="eager")
    model, ids = silenced(transformers.Gemma2ForCausalLM(cfg)), tokens(2, 12)
    assert source_of(model, ids).windows == {0: 4}
    assert_uniform(model, ids, 2)


def test_windows_per_layer_from_what_transformers_configs_say():
    qwen = transformers.Qwen2Config(num_hidden_layers=4, use_sliding_window=True, sliding_window=8, max_window_layers=2)
    cases = [
        (transformers.MistralConfig(num_hidden_layers=3, sliding_window=5), {0: 5, 1: 5, 2: 5}),
        (transformers.MistralConfig(num_hidden_layers=3, sliding_window=None), {}),
        (transformers.Qwen2Config(num_hidden_layers=4, sliding_window=8), {}),  # use_sliding_window False
        (qwen, {2: 8, 3: 8}),  # the layers from max_window_layers on
        (transformers.Gemma3TextConfig(num_hidden_layers=6, sliding_window=16), {l: 16 for l in range(5)}),
        (SimpleNamespace(sliding_window=16, sliding_window_pattern=3), {0: 16, 1: 16, 3: 16, 4: 16}),
        (None, {}),
    ]
    for config, want in cases:
        assert config_windows(config, 6 if isinstance(config, SimpleNamespace) else
                              getattr(config, "num_hidden_layers", 2)) == want, config


def test_nanochat_short_window_layers_when_importable():
    """nanochat's own GPT (its SDPA fallback): the short-window layer's boolean mask lets a row see
    window + 1 keys (nanochat's window counts the keys before the query): W_Q = 0 reads uniform."""
    model = nanochat_gpt(n_head=2, n_embd=32)
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_q.weight.zero_()
    ids = tokens(1, 160, vocab=64)  # longer than the short window (128)
    attn = source_of(model, ids)
    got = entropy.run(attn, ids)
    assert attn.windows == {0: model.window_sizes[0][0] + 1}
    grid = torch.tensor(got.entropy_normalized, dtype=torch.float64)
    assert torch.allclose(grid, torch.ones(2, 2, dtype=torch.float64), rtol=1e-6)
