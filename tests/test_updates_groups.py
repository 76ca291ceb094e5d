"""The groups a g / w / u table is read in: spread and flags by hand, the group of each parameter
name (ours, TransformerLens, nanoGPT, Hugging Face GPT-2 and Llama-style), GPT-2's packed c_attn
split into q, k and v rows in both layouts.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from probes import updates
from probes.update_parts.report import parameter_group


def test_groups_spread_and_flags_by_hand():
    table = {"embedding.weight": {"g": 1.0, "w": 1.0, "u": 1e-5, "u_nominal": None},
             "blocks.0.attention.heads.0.W_Q": {"g": 1.0, "w": 1.0, "u": 1e-4, "u_nominal": None},
             "blocks.0.attention.heads.1.W_K": {"g": 1.0, "w": 1.0, "u": 1e-6, "u_nominal": None},
             "blocks.0.attention.W_O": {"g": 1.0, "w": 1.0, "u": 0.0, "u_nominal": None},
             "blocks.0.mlp.net.0.weight": {"g": 1.0, "w": 1.0, "u": 1e-1, "u_nominal": None},
             "blocks.0.rms1.gamma": {"g": None, "w": None, "u": None, "u_nominal": None},
             "W_out": {"g": float("nan"), "w": 1.0, "u": 1e-3, "u_nominal": None}}
    report = updates.UpdateReport.from_table(table, band=(-4.5, -2.0))
    groups = report.groups
    assert groups["attention Q/K"]["median_log10_u"] == pytest.approx(-5.0)  # median of -4 and -6
    assert groups["MLP"]["median_log10_u"] == pytest.approx(-1.0)
    assert groups["attention V/O"]["median_log10_u"] is None  # u = 0 has no log
    assert report.spread == pytest.approx(-1.0 - (-5.0))
    assert report.flags == {"embedding.weight": ["slow"], "blocks.0.attention.heads.1.W_K": ["slow"],
                            "blocks.0.attention.W_O": ["frozen"], "blocks.0.mlp.net.0.weight": ["fast"],
                            "blocks.0.rms1.gamma": ["non-finite"], "W_out": ["non-finite"]}
    data = report.to_dict()
    assert set(data["parameters"]["W_out"]) == {"g", "w", "u", "u_nominal", "log10_u"}
    with pytest.raises(ValueError, match="band"):
        updates.UpdateReport.from_table(table, band=(-2.0, -4.0))


@pytest.mark.parametrize("name, group", [
    ("W_pos", "embeddings"), ("embedding.weight", "embeddings"), ("embed.W_E", "embeddings"),
    ("blocks.3.attention.heads.2.W_K", "attention Q/K"), ("blocks.0.attn.b_Q", "attention Q/K"),
    ("blocks.1.attention.W_O", "attention V/O"), ("blocks.0.attn.W_V", "attention V/O"),
    ("blocks.0.mlp.net.4.bias", "MLP"), ("mlp.net.0.weight", "MLP"), ("blocks.0.mlp.W_in", "MLP"),
    ("blocks.2.rms2.gamma", "norms"), ("blocks.0.ln1.w", "norms"), ("ln_final.beta", "norms"),
    ("W_out", "unembedding"), ("unembed.W_U", "unembedding")])
def test_parameter_groups_for_our_names_and_transformer_lens_names(name, group):
    assert parameter_group(name) == group


@pytest.mark.parametrize("name, group", [
    # nanoGPT's GPT and Hugging Face GPT-2 (c_attn split into q|k|v rows by named_trainable)
    ("transformer.wte.weight", "embeddings"), ("transformer.wpe.weight", "embeddings"),
    ("transformer.h.0.attn.c_attn.q.weight", "attention Q/K"), ("transformer.h.0.attn.c_attn.k.bias", "attention Q/K"),
    ("transformer.h.0.attn.c_attn.v.weight", "attention V/O"), ("transformer.h.3.attn.c_proj.weight", "attention V/O"),
    ("transformer.h.0.mlp.c_fc.weight", "MLP"), ("transformer.h.0.mlp.c_proj.bias", "MLP"),
    ("transformer.h.1.ln_1.weight", "norms"), ("transformer.ln_f.bias", "norms"), ("lm_head.weight", "unembedding"),
    # other modules, by the names most libraries use (Llama-style)
    ("model.embed_tokens.weight", "embeddings"), ("model.layers.0.self_attn.q_proj.weight", "attention Q/K"),
    ("model.layers.0.self_attn.o_proj.weight", "attention V/O"), ("model.layers.0.mlp.gate_proj.weight", "MLP"),
    ("model.layers.0.input_layernorm.weight", "norms"), ("model.norm.weight", "norms"),
    ("encoder.mystery.weight", "other")])
def test_parameter_groups_for_nanogpt_hf_gpt2_and_other_modules(name, group):
    assert parameter_group(name) == group


def test_gpt2_packed_c_attn_becomes_q_k_v_rows_in_both_layouts():
    """nn.Linear keeps q|k|v as rows of its [3d d] weight, Conv1D as columns of [d 3d]: each third
    is that kind's projection, whichever the layout."""
    class Conv1D(nn.Module):  # transformers.pytorch_utils.Conv1D's layout: weight [in out]
        def __init__(self, d_in: int, d_out: int):
            super().__init__()
            self.weight, self.bias = nn.Parameter(torch.randn(d_in, d_out)), nn.Parameter(torch.randn(d_out))

    for layer, dim in ((nn.Linear(4, 12), 0), (Conv1D(4, 12), 1)):
        model = nn.Module()
        model.attn = nn.Module()
        model.attn.c_attn = layer
        rows = updates.named_trainable(model)
        assert list(rows) == ["attn.c_attn.q.weight", "attn.c_attn.k.weight", "attn.c_attn.v.weight",
                              "attn.c_attn.q.bias", "attn.c_attn.k.bias", "attn.c_attn.v.bias"]
        for i, part in enumerate("qkv"):
            assert torch.equal(rows[f"attn.c_attn.{part}.weight"], layer.weight.narrow(dim, 4 * i, 4))
            assert torch.equal(rows[f"attn.c_attn.{part}.bias"], layer.bias[4 * i:4 * i + 4])
