"""The attention tap (`models.tap`) against answers it did not compute: Hugging Face's own eager
attention (`output_attentions=True`) on the same weights, the tutorial models' own patterns, and
patterns derivable on paper for the SDPA arguments (is_causal with q shorter than k, boolean and
additive masks, grouped kv heads)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
import torch.nn as nn
import torch.nn.functional as F

from gpt_kit import (BatchedGPT, ChatGPT, MhaGPT, PerHeadGPT, SdpaGPT, hf_pair, hf_patterns, nanochat_gpt,
                           own_patterns, tokens)
from models.tap import AttentionCall, StopTap, TapError, logits_of, tap_forward
from models.tap_rebuild import check_output, sdpa_arguments, sdpa_scores


def close(a: torch.Tensor, b: torch.Tensor, rtol: float = 1e-5) -> None:
    assert a.shape == b.shape
    assert float((a - b).abs().max()) <= rtol * max(float(b.abs().max()), 1e-30)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_tap_on_sdpa_model_equals_hf_eager_attentions(kind):
    sdpa, eager = hf_pair(kind)  # llama and qwen2: 4 query heads over 2 kv heads
    ids = tokens(2, 12)
    ref = hf_patterns(eager, ids)
    got = tap_forward(sdpa, ids)
    assert [name for name, _ in got.layers] == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    assert got.n_heads == [4, 4] and got.kinds == ["sdpa", "sdpa"]
    for (_, pattern), want in zip(got.layers, ref):
        close(pattern, want)
    with torch.no_grad():
        close(got.logits, eager(ids).logits, 1e-4)


@pytest.mark.parametrize("cls, names, kind", [
    (PerHeadGPT, ["trf_blocks.0.att", "trf_blocks.1.att"], "heads"),
    (BatchedGPT, ["blocks.0.sa", "blocks.1.sa"], "softmax"),
    (SdpaGPT, ["blocks.0.sa", "blocks.1.sa"], "sdpa"),
    (ChatGPT, ["transformer.h.0.attn", "transformer.h.1.attn"], "sdpa"),  # QK-norm, GQA, a window
])
def test_tutorial_models_keep_their_own_patterns(cls, names, kind):
    torch.manual_seed(0)
    model = cls().eval()
    ids = tokens(2, 16)
    ref = own_patterns(model, ids)
    got = tap_forward(model, ids)
    assert [n for n, _ in got.layers] == names and got.kinds == [kind, kind] and got.n_heads == [4, 4]
    for (_, pattern), want in zip(got.layers, ref):
        close(pattern, want)
    assert got.logits.shape == (2, 16, 50)


@pytest.mark.parametrize("need_weights, kind", [(False, "sdpa"), (True, "softmax")])
def test_multihead_attention_module_equals_its_own_weights(need_weights, kind):
    torch.manual_seed(0)
    model = MhaGPT().eval()
    ids = tokens(2, 10)
    ref = own_patterns(model, ids)  # the module's own need_weights=True, per head
    model.need_weights = need_weights
    got = tap_forward(model, ids)
    assert [n for n, _ in got.layers] == ["attns.0", "attns.1"] and got.kinds == [kind, kind]
    for (_, pattern), want in zip(got.layers, ref):
        close(pattern, want)
    assert F.softmax.__module__ == "torch.nn.functional" and F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention


def test_chat_model_explicit_path_through_tensor_softmax():
    torch.manual_seed(0)
    model = ChatGPT().eval()
    ids = tokens(1, 12)
    ref = own_patterns(model, ids)
    model.keep = True  # its explicit path: Tensor.softmax over [batch head q k]
    got = tap_forward(model, ids)
    assert got.kinds == ["softmax", "softmax"]
    for (_, pattern), want in zip(got.layers, ref):
        close(pattern, want)


class FoldedHeads(nn.Module):
    """Heads folded into the batch, as older code does: softmax over [batch*head q k] (bmm)."""

    def __init__(self, d: int = 16, heads: int = 4, vocab: int = 50):
        super().__init__()
        self.heads, self.kept = heads, []
        self.emb, self.qk, self.out = nn.Embedding(vocab, d), nn.Linear(d, 2 * d), nn.Linear(d, vocab)

    def forward(self, ids):
        b, n = ids.shape
        x = self.emb(ids)
        q, k = (t.reshape(b, n, self.heads, -1).transpose(1, 2).reshape(b * self.heads, n, -1)
                for t in self.qk(x).chunk(2, dim=-1))  # [batch*head pos d_head]
        att = torch.bmm(q, k.transpose(1, 2)).masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        p = F.softmax(att, dim=-1)
        self.kept.append(p.detach().view(b, self.heads, n, n))
        v = x.repeat_interleave(self.heads, 0)[..., : q.shape[-1]]
        return self.out(torch.bmm(p, v).reshape(b, self.heads, n, -1).transpose(1, 2).reshape(b, n, -1))


@pytest.mark.parametrize("batch", [1, 3])
def test_heads_folded_into_the_batch_are_unfolded(batch):
    torch.manual_seed(0)
    model = FoldedHeads().eval()
    got = tap_forward(model, tokens(batch, 7))
    assert got.n_heads == [4] and got.kinds == ["softmax"]
    close(got.layers[0][1], model.kept[-1])


def test_scores_are_pre_softmax_with_minus_inf_where_masked():
    sdpa, eager = hf_pair("llama")  # eager: HF adds the dtype's minimum, read as -inf
    ids = tokens(1, 8)
    for model in (sdpa, eager):
        def reduce(call: AttentionCall):
            hidden = torch.ones(8, 8, dtype=torch.bool).triu(1)
            assert bool(torch.isneginf(call.scores[..., hidden]).all())
            assert bool(torch.isfinite(call.scores[..., ~hidden]).all())
            close(call.scores.softmax(-1), call.pattern)
            return call.layer
        assert [v for _, v in tap_forward(model, ids, reduce).layers] == [0, 1]


class FixedSdpa(nn.Module):
    """One SDPA call on fixed q, k, v (q = 0: every visible key scores the same), the mask and
    flags given; ids only set the batch."""

    def __init__(self, n_q: int, n_k: int, heads: int = 2, kv_heads: int = 2, **call):
        super().__init__()
        self.shape, self.call = (n_q, n_k, heads, kv_heads), call

    def forward(self, ids):
        n_q, n_k, h, h_kv = self.shape
        q = torch.zeros(ids.shape[0], h, n_q, 4)
        k = torch.randn(ids.shape[0], h_kv, n_k, 4, generator=torch.Generator().manual_seed(0))
        v = torch.arange(n_k, dtype=torch.float32).repeat(ids.shape[0], h_kv, 1)[..., None].expand(-1, -1, -1, 3)
        return F.scaled_dot_product_attention(q, k, v, **self.call)


def pattern_of(model: nn.Module, batch: int = 1) -> torch.Tensor:
    (_, pattern), = tap_forward(model, torch.zeros(batch, 3, dtype=torch.long)).layers
    return pattern  # [batch head q k]


def test_is_causal_with_fewer_queries_than_keys_is_top_left_aligned():
    p = pattern_of(FixedSdpa(3, 5, is_causal=True))
    want = torch.tensor([[1, 0, 0, 0, 0], [1 / 2, 1 / 2, 0, 0, 0], [1 / 3, 1 / 3, 1 / 3, 0, 0]])
    close(p[0, 0], want)
    close(p[0, 1], want)


def test_boolean_mask_broadcast_over_batch_and_heads():
    mask = torch.tensor([[True, False, True, True], [False, True, False, False]])  # [q k]
    p = pattern_of(FixedSdpa(2, 4, attn_mask=mask), batch=2)
    want = torch.tensor([[1 / 3, 0, 1 / 3, 1 / 3], [0, 1, 0, 0]])
    for b in range(2):
        for h in range(2):
            close(p[b, h], want)


def test_additive_mask_weights_the_keys():
    weights = torch.tensor([1.0, 2.0, 5.0])  # exp(log w) / sum: w / 8
    mask = torch.stack([weights.log(), torch.tensor([0.0, float("-inf"), 0.0])])  # [q k]
    p = pattern_of(FixedSdpa(2, 3, attn_mask=mask))
    close(p[0, 0], torch.tensor([[1 / 8, 2 / 8, 5 / 8], [1 / 2, 0, 1 / 2]]))


def test_grouped_kv_heads_with_enable_gqa():
    p = pattern_of(FixedSdpa(2, 2, heads=4, kv_heads=2, is_causal=True, enable_gqa=True))
    assert p.shape == (1, 4, 2, 2)
    close(p[0, 3], torch.tensor([[1.0, 0.0], [0.5, 0.5]]))


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_rebuild_times_v_is_the_kernels_output_on_random_arguments(data):
    """sdpa_scores' pattern @ v equals torch's own SDPA output for random shapes, causal flags,
    boolean / additive masks, scales and grouped kv heads (check_output raises otherwise)."""
    draw = lambda s: data.draw(s)  # noqa: E731
    batch, kv, group, n_q, n_k, e = (draw(st.integers(1, hi)) for hi in (2, 2, 3, 6, 6, 8))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    q = torch.randn(batch, kv * group, n_q, e, generator=gen)
    k, v = (torch.randn(batch, kv, n_k, e, generator=gen) for _ in range(2))
    call = {"scale": draw(st.sampled_from([None, 0.1, 2.0])), "enable_gqa": group > 1}
    mask = draw(st.sampled_from(["causal", "none", "bool", "additive"]))
    if mask == "causal":
        call["is_causal"] = True
    elif mask == "bool":
        call["attn_mask"] = torch.rand(n_q, n_k, generator=gen) > 0.3
    elif mask == "additive":
        call["attn_mask"] = torch.randn(batch, 1, n_q, n_k, generator=gen)
    out = F.scaled_dot_product_attention(q, k, v, **call)
    args = sdpa_arguments((q, k, v), call)
    pattern = torch.softmax(sdpa_scores(args), dim=-1)  # [batch head q k]
    check_output(pattern, args, out, "random")
    visible = torch.isfinite(pattern).all(-1)
    assert torch.allclose(pattern.sum(-1)[visible], torch.ones(()), atol=1e-5)


def test_pattern_times_v_mismatch_is_refused_in_one_line():
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 4, 8, generator=gen) for _ in range(3))
    args = sdpa_arguments((q, k, v), {"is_causal": True})
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    pattern = (q @ k.transpose(-1, -2) / math.sqrt(8)).masked_fill(torch.ones(4, 4, dtype=torch.bool).triu(1),
                                                                   float("-inf")).softmax(-1)
    check_output(pattern, args, out, "blocks.0.attn")  # the real output passes
    wrong = out.clone()
    wrong[0, 1, 2] += 0.05 * float(v.abs().max())  # one row of one head off by 5% of the values' scale
    with pytest.raises(TapError) as err:
        check_output(pattern, args, wrong, "blocks.0.attn")
    assert "\n" not in str(err.value) and "blocks.0.attn" in str(err.value)


def test_an_autocast_call_is_checked_at_the_precision_its_kernel_ran():
    """bf16 autocast (the usual GPU loop) casts the call's float32 arguments down: its output's
    rounding is not a mismatch, and the model's entropy is read, close to float32's."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 4, 32, 16, generator=gen) for _ in range(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert out.dtype == torch.bfloat16 and q.dtype == torch.float32
    args = sdpa_arguments((q, k, v), {"is_causal": True})
    check_output(torch.softmax(sdpa_scores(args), dim=-1), args, out, "blocks.0.attn")
    from probes import entropy
    torch.manual_seed(0)
    model, ids = ChatGPT(), tokens(2, 16)
    want = entropy.run(model, ids).entropy  # [layer][head], float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = entropy.run(model, ids).entropy
    for row, want_row in zip(got, want):  # bf16 projections before the call: ~3 significant digits
        assert row == pytest.approx(want_row, abs=5e-3)


def test_compiled_and_flex_models_are_refused_naming_the_switch():
    with pytest.raises(TapError, match="before torch.compile"):
        tap_forward(torch.compile(SdpaGPT()), tokens(1, 4))
    from gpt_kit import hf_model
    with pytest.raises(TapError, match='attn_implementation="sdpa"'):
        tap_forward(hf_model("llama", "flex_attention"), tokens(1, 4))


def test_flash_attention_models_are_refused_naming_the_switch():
    flash = SdpaGPT()
    flash.config = type("Config", (), {"_attn_implementation": "flash_attention_2"})()
    with pytest.raises(TapError, match="'flash_attention_2'.*attn_implementation=\"sdpa\""):
        tap_forward(flash, tokens(1, 4))
    fa3 = type("GPT", (nn.Module,), {"__module__": "nanochat.gpt", "forward": lambda self, ids: ids.float()})()
    with pytest.raises(TapError, match="nanochat.flash_attention.USE_FA3 = False"):
        tap_forward(fa3, tokens(1, 4))  # nanochat's FA3 kernel: no call the tap reads


def test_model_without_attention_is_refused_not_an_empty_grid():
    mlp = nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 50))
    with pytest.raises(TapError, match="no attention call the tap can read") as err:
        tap_forward(mlp, tokens(1, 6))
    assert "\n" not in str(err.value)


def test_the_model_is_left_as_it_was():
    torch.manual_seed(0)
    model = BatchedGPT().train()
    model.blocks[1].eval()  # a mixed mode is put back as it was
    before = {k: v.clone() for k, v in model.state_dict().items()}
    got = tap_forward(model, tokens(1, 8))
    assert model.training and not model.blocks[1].training and model.blocks[0].training
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not got.logits.requires_grad and F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention


def test_reduce_runs_per_layer_and_stop_ends_the_pass():
    torch.manual_seed(0)
    model = PerHeadGPT(n_layers=3).eval()
    seen = []

    def reduce(call: AttentionCall):
        seen.append((call.module, call.layer, tuple(call.pattern.shape)))
        if call.layer == 1:
            raise StopTap
        return call.pattern.sum()
    got = tap_forward(model, tokens(2, 5), reduce)
    assert seen == [("trf_blocks.0.att", 0, (2, 4, 5, 5)), ("trf_blocks.1.att", 1, (2, 4, 5, 5))]
    assert got.logits is None and len(got.layers) == 1
    close(got.layers[0][1], torch.tensor(40.0))  # 2 windows x 4 heads x 5 rows, each row sums to 1


def test_logits_of_the_output_shapes_people_return():
    x = torch.ones(1, 2, 3)
    assert logits_of(x) is x and logits_of((x, None)) is x and logits_of({"logits": x}) is x
    assert logits_of(type("Out", (), {"logits": x})()) is x
    with pytest.raises(TapError, match="not logits"):
        logits_of("text")


def test_nanochat_gpt_when_importable():
    """nanochat's own GPT (its SDPA fallback on CPU: QK-norm, GQA, sliding window mask) against the
    pattern rebuilt in this test from the q, k it hands its attention function and its window."""
    model = nanochat_gpt()
    fa = pytest.importorskip("nanochat.flash_attention")
    ids = tokens(1, 160, vocab=64)  # longer than the short window (128)
    seen, real = [], fa.flash_attn.flash_attn_func

    def spy(q, k, v, causal=False, window_size=(-1, -1)):
        seen.append((q.transpose(1, 2), k.transpose(1, 2), window_size[0]))
        return real(q, k, v, causal=causal, window_size=window_size)
    fa.flash_attn.flash_attn_func = spy
    try:
        got = tap_forward(model, ids)
    finally:
        fa.flash_attn.flash_attn_func = real
    assert [n for n, _ in got.layers] == ["transformer.h.0.attn", "transformer.h.1.attn"]
    for (_, pattern), (q, k, window) in zip(got.layers, seen):
        k = k.repeat_interleave(2, dim=1)  # [batch head pos d]
        i = torch.arange(160)
        seen_keys = (i[None] <= i[:, None]) & (i[:, None] - i[None] <= window)
        want = (q @ k.transpose(-1, -2) / math.sqrt(16)).masked_fill(~seen_keys, float("-inf")).softmax(-1)
        close(pattern, want)
