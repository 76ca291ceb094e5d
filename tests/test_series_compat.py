"""Our presets reproduce the series' own models: a series state_dict loads with strict=True and
gives the same logits, the same parameter names and the same attention entropy.

The series' models are its code as written, in tests/gpt_kit/series.py (`Series*`, and
`series_model` for the series' model of one of our presets, at small sizes).
"""

from __future__ import annotations

import pytest
import torch
from close import assert_close_to_scale
from gpt_kit.series import D, MLP_DH, N, VOCAB, SeriesTransformer, SeriesTransformerBlockRMS, series_model
from torch import nn

from models import build_model, get_preset
from models.transformer import series_key


# ---- preset <-> series model ---------------------------------------------------------------------

def our_config(name: str):
    """The FULL preset with only its sizes shrunk to the series instance's."""
    full = get_preset(name)
    d_head = D if full.d_head == full.d_model else D // full.n_heads
    return full.replace(d_vocab=VOCAB, n_ctx=N, d_model=D, d_head=d_head, d_mlp=MLP_DH)


SERIES_PRESETS = ["attn1_noscale", "attn1_sqrtd", "attn1_residual", "mha4_fullrank", "mha4",
                  "transformer2", "transformer4", "transformer4_rms"]
MULTI_BLOCK = ["transformer2", "transformer4", "transformer4_rms"]


def tokens(batch: int = 4, seed: int = 7) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, N), generator=torch.Generator().manual_seed(seed))


def pair(name: str):
    torch.manual_seed(0)
    series = series_model(name).eval()
    torch.manual_seed(123)  # a different init, so only the loaded state can make them agree
    ours = build_model(our_config(name)).eval()
    return series, ours


def series_heads(series: nn.Module):
    """The series' attention modules per block (they hold `last_entropy`)."""
    if hasattr(series, "blocks"):
        return [list(block.attention.heads) for block in series.blocks]
    att = series.attention
    return [list(att.heads) if hasattr(att, "heads") else [att]]


@pytest.mark.parametrize("name", SERIES_PRESETS)
def test_series_state_dict_loads_and_logits_match(name):
    series, ours = pair(name)
    x = tokens()
    assert (ours(x) - series(x)).abs().max() > 1e-3  # not equal by accident
    state = series.state_dict()
    keys_before = list(state)
    result = ours.load_state_dict(state, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    assert list(state) == keys_before  # the caller's dict is not renamed in place
    with torch.no_grad():
        assert_close_to_scale(ours(x), series(x))
        ours.set_attn_impl("explicit")
        assert_close_to_scale(ours(x), series(x))


@pytest.mark.parametrize("name", SERIES_PRESETS)
def test_loaded_weights_are_the_series_weights(name):
    """Parameter by parameter, after the AttnNet renaming (attention.W_Q -> heads.0.W_Q)."""
    series, ours = pair(name)
    ours.load_state_dict(series.state_dict(), strict=True)
    ours_params = ours.series_parameters()
    for key, value in series.state_dict().items():
        if not key.startswith(("attention.", "mlp.")):
            our_key = key
        elif key.startswith("attention.W_") and key[-1] in "QKV":
            our_key = f"blocks.0.attention.heads.0.{key.split('.')[-1]}"
        else:
            our_key = f"blocks.0.{key}"
        assert series_key(key) == our_key  # the mapping the checkpoint loader uses
        assert torch.equal(ours_params[our_key], value), key


@pytest.mark.parametrize("name", MULTI_BLOCK)
def test_multi_block_names_are_identical(name):
    series, ours = pair(name)
    assert set(series.state_dict()) == set(ours.state_dict())
    assert {k: tuple(v.shape) for k, v in series.state_dict().items()} == \
           {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    # and our state dict loads back into the series' model
    series.load_state_dict(ours.state_dict(), strict=True)
    x = tokens()
    assert_close_to_scale(ours(x), series(x))


# the rows of the series' g/w/u table (transformer4_rms log), names as printed
SERIES_LOG_NAMES = ["W_pos", "W_out", "embedding.weight"] + [
    name for b in range(4) for name in (
        [f"blocks.{b}.attention.W_O"]
        + [f"blocks.{b}.attention.heads.{h}.W_{m}" for h in range(4) for m in "QKV"]
        + [f"blocks.{b}.mlp.net.{i}.{p}" for i in (0, 2, 4) for p in ("weight", "bias")]
        + [f"blocks.{b}.rms{i}.gamma" for i in (1, 2)])]


def test_series_log_parameter_names_and_full_size_shapes():
    """The full transformer4_rms preset has exactly the parameters of the series' logged model."""
    class FullTokenizer:
        vocab_size = 2048

    with torch.device("meta"):
        ours = build_model(get_preset("transformer4_rms"))
        series = SeriesTransformer(FullTokenizer(), 32, 256, 4, 64, 4, 256 * 8, 2,
                                   block_cls=SeriesTransformerBlockRMS)
    ours_params = {k: tuple(v.shape) for k, v in ours.series_parameters().items()}
    series_params = {k: tuple(v.shape) for k, v in series.named_parameters()}
    assert set(SERIES_LOG_NAMES) == set(ours_params)
    assert ours_params == series_params
    assert list(series_params) == SERIES_LOG_NAMES  # the log's row order is named_parameters()
    assert f"{sum(p.numel() for p in series.parameters()) / 1e6:.1f}M" == "23.1M"  # the log's n_params


def test_parameter_order_matches_the_series_log():
    """A g/w/u table printed in series_parameters() order lists rows as the series' log does."""
    with torch.device("meta"):
        ours = build_model(get_preset("transformer4_rms"))
    assert list(ours.series_parameters()) == SERIES_LOG_NAMES


def entropy_series_way(attn: torch.Tensor) -> float:
    return -(attn * (attn + 1e-10).log()).sum(dim=-1).mean().item()


@pytest.mark.parametrize("name", SERIES_PRESETS)
def test_attention_entropy_matches_the_series_log(name):
    series, ours = pair(name)
    ours.load_state_dict(series.state_dict(), strict=True)
    x = tokens(batch=8)
    with torch.no_grad():
        series(x)
        _, cache = ours.run_with_cache(x, names_filter=lambda nm: nm.endswith("hook_pattern"))
    heads = series_heads(series)
    assert len(heads) == ours.cfg.n_layers
    for layer, layer_heads in enumerate(heads):
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"]  # [batch head q k]
        assert pattern.shape[1] == len(layer_heads)
        for h, head in enumerate(layer_heads):
            ours_entropy = entropy_series_way(pattern[:, h])
            assert abs(ours_entropy - head.last_entropy) < 1e-6, (layer, h)


def test_unscaled_attention_collapses_like_the_series():
    """attn1_noscale at init: near one-hot attention, as in the post (entropy 0.003)."""
    series, ours = pair("attn1_noscale")
    ours.load_state_dict(series.state_dict(), strict=True)
    _, cache = ours.run_with_cache(tokens(batch=16), names_filter="blocks.0.attn.hook_pattern")
    collapsed = entropy_series_way(cache["blocks.0.attn.hook_pattern"][:, 0])
    series_s, ours_s = pair("attn1_sqrtd")
    ours_s.load_state_dict(series_s.state_dict(), strict=True)
    _, cache_s = ours_s.run_with_cache(tokens(batch=16), names_filter="blocks.0.attn.hook_pattern")
    scaled = entropy_series_way(cache_s["blocks.0.attn.hook_pattern"][:, 0])
    assert collapsed < 0.1 < scaled


@pytest.mark.parametrize("name", SERIES_PRESETS)
def test_init_distribution_matches_the_series(name):
    """A fresh model of each preset starts from the series' init (same std per parameter)."""
    series, ours = pair(name)
    ours_params = ours.series_parameters()
    for key, value in series.named_parameters():
        mine = ours_params[series_key(key)]
        assert mine.shape == value.shape, key
        if key.endswith("gamma"):
            assert torch.equal(mine, value), key  # ones
        elif value.numel() >= 256:
            ratio = mine.std().item() / value.std().item()
            assert 0.85 < ratio < 1.18, f"{key}: std {mine.std().item():.4f} vs series {value.std().item():.4f}"


def test_the_scale_tolerance_passes_rounding_and_fails_one_wrong_weight():
    """transformer4's logits reach ~20: another CPU's rounding (1.054e-5 on 1 of 1600 logits, past
    an absolute 1e-5) is within 1e-5 of that scale; one weight off by 1e-3 is not."""
    series, ours = pair("transformer4")
    ours.load_state_dict(series.state_dict(), strict=True)
    x = tokens()
    with torch.no_grad():
        want = series(x)
        assert float(want.abs().max()) > 10
        assert_close_to_scale(want + 1.054e-5 * torch.sign(torch.randn_like(want)), want)
        ours.W_out[3, 5] += 1e-3
        with pytest.raises(AssertionError):
            assert_close_to_scale(ours(x), want)
