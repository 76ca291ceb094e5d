"""Config validation: errors name the bad field, frozen configs revalidate on replace, dict round
trips, and any valid random transformer config builds, runs and its two attention paths agree.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from close import assert_close_to_scale
from models_kit import ALL, FAST, MODEL_PROPERTY, build, expected_hooks, expected_params, n_params, rand_tokens
from hypothesis import given
from hypothesis import strategies as st

from models import MLPConfig, TransformerConfig, build_model, config_from_dict, get_preset


# --------------------------------------------------------------------------------------------
# config validation
# --------------------------------------------------------------------------------------------

TF_BASE = get_preset("transformer4_rms_small")
MLP_BASE = get_preset("char_mlp_small")


@pytest.mark.parametrize("changes, field", [
    (dict(attn_scale="sqrt"), "attn_scale"),
    (dict(n_heads=0), "n_heads"),
    (dict(d_head=-4), "d_head"),
    (dict(n_layers=1.5), "n_layers"),
    (dict(d_model=True), "d_model"),
    (dict(dropout=1.5), "dropout"),
    (dict(dropout=1.0), "dropout"),
    (dict(dropout=-0.1), "dropout"),
    (dict(dropout=float("nan")), "dropout"),
    (dict(norm="batch"), "norm"),
    (dict(norm_placement="sandwich"), "norm_placement"),
    (dict(norm_eps=0.0), "norm_eps"),
    (dict(act_fn="swish"), "act_fn"),
    (dict(pos_embed="rope"), "pos_embed"),
    (dict(init="xavier"), "init"),
    (dict(unembed="mlp"), "unembed"),  # with residual=True and 2 layers
    (dict(unembed="mlp", residual=False, n_layers=1, attn_out_proj=True, norm="none",
          n_heads=1, d_head=32, mlp_depth=1), None),  # a valid combination, for contrast
    (dict(norm="none", final_norm=True), "final_norm"),
    (dict(attn_out_proj=False), None),  # 4 * 8 == 32: allowed
    (dict(attn_out_proj=False, d_head=4), "attn_out_proj"),
])
def test_transformer_config_errors_name_the_field(changes, field):
    if field is None:
        TF_BASE.replace(**changes)
        return
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        TF_BASE.replace(**changes)


@pytest.mark.parametrize("changes, field", [
    (dict(d_embed=0), "d_embed"), (dict(n_ctx=-1), "n_ctx"), (dict(n_hidden_layers=0),
                                                                "n_hidden_layers"),
    (dict(act_fn="softplus"), "act_fn"), (dict(dropout=2), "dropout"),
])
def test_mlp_config_errors_name_the_field(changes, field):
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        MLP_BASE.replace(**changes)


POSITIVE_TF = ["d_vocab", "n_ctx", "d_model", "n_layers", "n_heads", "d_head", "d_mlp", "mlp_depth"]


@FAST
@given(field=st.sampled_from(POSITIVE_TF), value=st.integers(max_value=0))
def test_nonpositive_sizes_rejected(field, value):
    with pytest.raises(ValueError, match=rf"TransformerConfig\.{field} must be a positive int"):
        TF_BASE.replace(**{field: value})


@FAST
@given(value=st.floats(allow_nan=True, allow_infinity=True))
def test_dropout_must_be_a_probability(value):
    if 0.0 <= value < 1.0:
        assert TF_BASE.replace(dropout=value).dropout == value
        assert MLP_BASE.replace(dropout=value).dropout == value
    else:
        with pytest.raises(ValueError, match="dropout"):
            TF_BASE.replace(dropout=value)
        with pytest.raises(ValueError, match="dropout"):
            MLP_BASE.replace(dropout=value)


@FAST
@given(field=st.sampled_from(["act_fn", "attn_scale", "norm", "norm_placement", "pos_embed",
                              "unembed", "init"]),
       value=st.one_of(st.text(max_size=12), st.none(), st.integers()))
def test_choice_fields_reject_anything_else(field, value):
    from models import config as config_mod
    choices = {"act_fn": config_mod.ACT_FNS, "attn_scale": config_mod.ATTN_SCALES,
               "norm": config_mod.NORMS, "norm_placement": config_mod.NORM_PLACEMENTS,
               "pos_embed": config_mod.POS_EMBEDS, "unembed": config_mod.UNEMBEDS,
               "init": config_mod.INITS}[field]
    if value in choices:
        return
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        TF_BASE.replace(**{field: value})


@pytest.mark.parametrize("field", ["residual", "final_norm", "attn_out_proj", "attn_bias", "mlp_bias", "norm_bias"])
@pytest.mark.parametrize("value", ["no", "False", 0, 1, None])
def test_bool_switches_reject_non_bools(field, value):
    """residual='no' (a CLI override, a hand-edited config.json) must not be truthy-True."""
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        get_preset("tiny_shakespeare_gpt_small").replace(**{field: value})


@pytest.mark.parametrize("changes", [dict(norm="rms", final_norm=True),
                                     dict(norm="layer", norm_placement="post"),
                                     dict(norm="rms", norm_placement="post")])
def test_mlp_unembed_refuses_a_norm_after_the_vocab_wide_mlp(changes):
    """The last MLP outputs d_vocab; a d_model-wide norm after it is refused at config time
    (it used to crash in forward with a shape RuntimeError)."""
    with pytest.raises(ValueError, match="unembed"):
        get_preset("attn1_sqrtd_small").replace(**changes)
    # pre-norm inside the block is fine
    cfg = get_preset("attn1_sqrtd_small").replace(norm=changes["norm"], norm_placement="pre")
    assert build(cfg)(rand_tokens(cfg)).shape == (2, cfg.n_ctx, cfg.d_vocab)


def test_configs_are_frozen_and_replace_revalidates():
    with pytest.raises(dataclasses.FrozenInstanceError):
        TF_BASE.n_heads = 2  # type: ignore[misc]
    with pytest.raises(ValueError, match="n_heads"):
        TF_BASE.replace(n_heads=0)
    assert TF_BASE.replace(n_heads=2, d_head=16).d_attn == 32


@pytest.mark.parametrize("name", ALL)
def test_config_dict_round_trip(name):
    cfg = get_preset(name)
    data = cfg.to_dict()
    assert data["family"] == ("mlp" if isinstance(cfg, MLPConfig) else "transformer")
    assert config_from_dict(data) == cfg
    assert config_from_dict(json.loads(json.dumps(data))) == cfg  # survives a checkpoint's JSON
    assert type(config_from_dict(data)) is type(cfg)


def test_config_from_dict_errors():
    data = TF_BASE.to_dict()
    with pytest.raises(ValueError, match="unknown model family 'rnn'"):
        config_from_dict({**data, "family": "rnn"})
    with pytest.raises(ValueError, match="unknown model family None"):
        config_from_dict({k: v for k, v in data.items() if k != "family"})
    with pytest.raises(ValueError, match=r"unknown transformer config field\(s\) \['n_experts'\]"):
        config_from_dict({**data, "n_experts": 8})
    with pytest.raises(ValueError, match=r"missing field\(s\) \['d_model'\]"):
        config_from_dict({k: v for k, v in data.items() if k != "d_model"})
    with pytest.raises(ValueError, match="JSON object"):
        config_from_dict([("family", "mlp")])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n_heads"):
        config_from_dict({**data, "n_heads": 0})
    mlp_data = MLP_BASE.to_dict()
    with pytest.raises(ValueError, match=r"unknown mlp config field\(s\) \['n_layers'\]"):
        config_from_dict({**mlp_data, "n_layers": 2})
    with pytest.raises(ValueError, match="build_model needs"):
        build_model(data)  # type: ignore[arg-type]


# a valid random transformer: every switch, small sizes
@st.composite
def small_transformer_configs(draw):
    n_heads = draw(st.sampled_from([1, 2, 4]))
    d_model = draw(st.sampled_from([8, 16]))
    residual = draw(st.booleans())
    n_layers = draw(st.integers(1, 2))
    unembed = draw(st.sampled_from(["separate", "tied"] + (["mlp"] if not residual else [])))
    if unembed == "mlp":
        n_layers = 1
    attn_out_proj = draw(st.booleans())
    d_head = d_model // n_heads if not attn_out_proj else draw(st.sampled_from([4, d_model]))
    norm = draw(st.sampled_from(["none", "rms", "layer"]))
    placement = draw(st.sampled_from(["pre", "post"]))
    final_norm = norm != "none" and draw(st.booleans())
    if unembed == "mlp":  # a d_model-wide norm after the vocab-wide MLP is refused (above)
        placement, final_norm = "pre", False
    return TransformerConfig(
        d_vocab=draw(st.integers(2, 40)), n_ctx=draw(st.integers(1, 9)), d_model=d_model,
        n_layers=n_layers, n_heads=n_heads, d_head=d_head, d_mlp=draw(st.sampled_from([8, 24])),
        mlp_depth=draw(st.integers(1, 3)), act_fn=draw(st.sampled_from(["relu", "gelu", "tanh"])),
        attn_scale=draw(st.sampled_from(["none", "sqrt_d_model", "sqrt_d_head"])),
        residual=residual, norm=norm, norm_placement=placement, final_norm=final_norm,
        attn_out_proj=attn_out_proj, attn_bias=draw(st.booleans()), mlp_bias=draw(st.booleans()),
        pos_embed=draw(st.sampled_from(["learned", "none"])), unembed=unembed,
        init=draw(st.sampled_from(["series", "gpt2"])))


@MODEL_PROPERTY
@given(cfg=small_transformer_configs(), batch=st.integers(1, 3))
def test_any_valid_config_builds_runs_and_paths_agree(cfg, batch):
    model = build(cfg)
    assert n_params(model) == expected_params(cfg)
    toks = rand_tokens(cfg, batch=batch)
    model.set_attn_impl("explicit")
    logits_e = model(toks)
    model.set_attn_impl("fused")
    logits_f = model(toks)
    assert logits_e.shape == (batch, cfg.n_ctx, cfg.d_vocab)
    assert_close_to_scale(logits_f, logits_e)
    assert config_from_dict(cfg.to_dict()) == cfg
    model.set_attn_impl("auto")
    _, cache = model.run_with_cache(toks)
    assert set(cache.keys()) == set(expected_hooks(cfg))
