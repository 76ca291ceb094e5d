"""Parameter groups (`probes.update_parts.report.parameter_group` over `probes.updates.named_trainable`)
on the real parameter names of the models people train from scratch: nanochat's GPT, Hugging Face
Llama / Qwen2 / GPT-NeoX, and GPTs written the way tutorials write them. No main weight of any of
them may land in "other"; a packed q/k/v is split so that Q/K and V are grouped apart."""

from __future__ import annotations


import pytest
import torch
from torch import nn

from probes.update_parts.report import parameter_group
from probes.updates import named_trainable

def groups_of(model: nn.Module) -> dict[str, str]:
    return {name: parameter_group(name) for name in named_trainable(model)}


# ---------------------------------------------------------------- tutorial GPTs, in their own words

class Head(nn.Module):  # one module per head, a softmax over [batch q k] (the video lecture's style)
    def __init__(self, d: int, d_head: int):
        super().__init__()
        self.key, self.query, self.value = (nn.Linear(d, d_head, bias=False) for _ in range(3))


class HeadsAttention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = nn.ModuleList(Head(d, d // heads) for _ in range(heads))
        self.proj = nn.Linear(d, d)


class LectureBlock(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.sa = HeadsAttention(d, 2)
        self.ffwd = nn.Sequential(nn.Linear(d, 4 * d), nn.ReLU(), nn.Linear(4 * d, d))
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)


class LectureGPT(nn.Module):
    def __init__(self, d: int = 8, vocab: int = 11, ctx: int = 6):
        super().__init__()
        self.token_embedding_table = nn.Embedding(vocab, d)
        self.position_embedding_table = nn.Embedding(ctx, d)
        self.blocks = nn.Sequential(LectureBlock(d), LectureBlock(d))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab)


class BookNorm(nn.Module):  # a LayerNorm of its own, with scale and shift (the book's style)
    def __init__(self, d: int):
        super().__init__()
        self.scale, self.shift = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))


class BookAttention(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.W_query, self.W_key, self.W_value = (nn.Linear(d, d, bias=False) for _ in range(3))
        self.out_proj = nn.Linear(d, d)


class BookBlock(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.att = BookAttention(d)
        self.ff = nn.Module()
        self.ff.layers = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.norm1, self.norm2 = BookNorm(d), BookNorm(d)


class BookGPT(nn.Module):
    def __init__(self, d: int = 8, vocab: int = 11, ctx: int = 6):
        super().__init__()
        self.tok_emb, self.pos_emb = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.trf_blocks = nn.Sequential(BookBlock(d), BookBlock(d))
        self.final_norm = BookNorm(d)
        self.out_head = nn.Linear(d, vocab, bias=False)


class PackedBlock(nn.Module):  # one packed qkv, a batched softmax over [batch head q k]
    def __init__(self, d: int):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.Module()
        self.attn.qkv, self.attn.out_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))


class PackedGPT(nn.Module):
    def __init__(self, d: int = 8, vocab: int = 11, ctx: int = 6):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(ctx, d))
        self.blocks = nn.ModuleList(PackedBlock(d) for _ in range(2))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)


class TorchMHABlock(nn.Module):  # torch's own nn.MultiheadAttention: in_proj_weight packs q, k, v
    def __init__(self, d: int):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, 2, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.norm1 = nn.LayerNorm(d)


@pytest.mark.parametrize("model, expected", [
    (LectureGPT(), {"token_embedding_table.weight": "embeddings", "position_embedding_table.weight": "embeddings",
                    "blocks.0.sa.heads.1.key.weight": "attention Q/K", "blocks.0.sa.heads.0.query.weight": "attention Q/K",
                    "blocks.1.sa.heads.0.value.weight": "attention V/O", "blocks.0.sa.proj.weight": "attention V/O",
                    "blocks.0.ffwd.0.weight": "MLP", "blocks.1.ffwd.2.bias": "MLP", "blocks.0.ln1.weight": "norms",
                    "ln_f.bias": "norms", "lm_head.weight": "unembedding"}),
    (BookGPT(), {"tok_emb.weight": "embeddings", "pos_emb.weight": "embeddings",
                 "trf_blocks.0.att.W_query.weight": "attention Q/K", "trf_blocks.0.att.W_key.weight": "attention Q/K",
                 "trf_blocks.1.att.W_value.weight": "attention V/O", "trf_blocks.1.att.out_proj.bias": "attention V/O",
                 "trf_blocks.0.ff.layers.0.weight": "MLP", "trf_blocks.0.norm1.scale": "norms",
                 "trf_blocks.0.norm2.shift": "norms", "final_norm.scale": "norms", "out_head.weight": "unembedding"}),
    (PackedGPT(), {"tok_emb.weight": "embeddings", "pos": "embeddings",
                   "blocks.0.attn.qkv.q.weight": "attention Q/K", "blocks.0.attn.qkv.k.bias": "attention Q/K",
                   "blocks.0.attn.qkv.v.weight": "attention V/O", "blocks.1.attn.out_proj.weight": "attention V/O",
                   "blocks.0.ff.2.weight": "MLP", "blocks.0.n1.weight": "norms", "blocks.1.n2.bias": "norms",
                   "ln_f.weight": "norms", "head.weight": "unembedding"}),
    (TorchMHABlock(8), {"attn.in_proj.q.weight": "attention Q/K", "attn.in_proj.k.bias": "attention Q/K",
                        "attn.in_proj.v.weight": "attention V/O", "attn.out_proj.weight": "attention V/O",
                        "mlp.0.weight": "MLP", "norm1.weight": "norms"}),
], ids=["lecture", "book", "packed", "torch_mha"])
def test_tutorial_gpts_have_every_weight_in_a_group(model, expected):
    groups = groups_of(model)
    assert {n: groups[n] for n in expected} == expected
    assert [n for n, g in groups.items() if g == "other"] == []


def test_a_packed_qkv_splits_into_views_of_its_thirds():
    model = PackedGPT()
    rows = named_trainable(model)
    weight = model.blocks[0].attn.qkv.weight  # [3d d]
    for i, part in enumerate("qkv"):
        assert torch.equal(rows[f"blocks.0.attn.qkv.{part}.weight"], weight[8 * i:8 * (i + 1)])
    assert rows["blocks.0.attn.qkv.q.weight"].data_ptr() == weight.data_ptr()  # a view, not a copy


# ---------------------------------------------------------------- Hugging Face, built in memory

def hf_model(kind: str) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    small = dict(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                 num_attention_heads=4, max_position_embeddings=16)
    if kind == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**small, num_key_value_heads=2))
    if kind == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**small, num_key_value_heads=2))
    return transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**small))


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_llama_family_groups(kind):
    groups = groups_of(hf_model(kind))
    for proj, group in (("q_proj", "attention Q/K"), ("k_proj", "attention Q/K"), ("v_proj", "attention V/O"),
                        ("o_proj", "attention V/O")):
        assert groups[f"model.layers.1.self_attn.{proj}.weight"] == group
    for proj in ("gate_proj", "up_proj", "down_proj"):
        assert groups[f"model.layers.0.mlp.{proj}.weight"] == "MLP"
    assert groups["model.embed_tokens.weight"] == "embeddings"
    assert groups["model.layers.0.post_attention_layernorm.weight"] == "norms"
    assert groups["lm_head.weight"] == "unembedding"
    assert [n for n, g in groups.items() if g == "other"] == []


def test_gpt_neox_query_key_value_is_split_per_head_as_the_model_reads_it():
    model = hf_model("gpt_neox")
    groups = groups_of(model)
    assert groups["gpt_neox.layers.0.attention.query_key_value.q.weight"] == "attention Q/K"
    assert groups["gpt_neox.layers.0.attention.query_key_value.v.bias"] == "attention V/O"
    assert [n for n, g in groups.items() if g == "other"] == []
    # the model's own q: its forward views the projection as [batch pos head 3*d_head]
    attention = model.gpt_neox.layers[0].attention
    x = torch.randn(1, 3, 16)
    q_model = attention.query_key_value(x).view(1, 3, 4, 12)[..., :4]  # [batch pos head d_head]
    rows = named_trainable(model)
    w, b = rows["gpt_neox.layers.0.attention.query_key_value.q.weight"], rows["gpt_neox.layers.0.attention.query_key_value.q.bias"]
    q_rows = torch.einsum("hed,bpd->bphe", w, x) + b  # w [head d_head d_model]
    torch.testing.assert_close(q_rows, q_model)


# ---------------------------------------------------------------- nanochat

NANOCHAT_NAMES = {  # its GPT's parameter names (n_layer=2: value embeddings and ve_gate on layer 1)
    "resid_lambdas": "scalars", "x0_lambdas": "scalars", "smear_lambda": "scalars", "backout_lambda": "scalars",
    "smear_gate.weight": "scalars", "transformer.wte.weight": "embeddings", "value_embeds.1.weight": "embeddings",
    "transformer.h.0.attn.c_q.weight": "attention Q/K", "transformer.h.0.attn.c_k.weight": "attention Q/K",
    "transformer.h.0.attn.c_v.weight": "attention V/O", "transformer.h.0.attn.c_proj.weight": "attention V/O",
    "transformer.h.1.attn.ve_gate.weight": "attention V/O", "transformer.h.0.mlp.c_fc.weight": "MLP",
    "transformer.h.0.mlp.c_proj.weight": "MLP", "lm_head.weight": "unembedding"}


def test_nanochat_names():
    assert {n: parameter_group(n) for n in NANOCHAT_NAMES} == NANOCHAT_NAMES


def test_nanochat_real_gpt_has_no_parameter_in_other():
    gpt = pytest.importorskip("nanochat.gpt")  # its users have it; a clone on PYTHONPATH runs it here
    config = gpt.GPTConfig(sequence_len=16, vocab_size=64, n_layer=2, n_head=2, n_kv_head=1, n_embd=32)
    groups = groups_of(gpt.GPT(config))
    assert set(NANOCHAT_NAMES) <= set(groups)
    assert {n: groups[n] for n in NANOCHAT_NAMES} == NANOCHAT_NAMES
    assert [n for n, g in groups.items() if g == "other"] == []
