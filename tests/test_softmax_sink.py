"""Entropy from the model's own attention call (`Attention.softmax_sink`, `probes.rows.qk.SoftmaxSink`):
the layer's fused call carries k through the softmax beside v, so the probe needs no second
kernel call. The layer's output is unchanged, the statistics are the paper's (logsumexp of the
scores, sum_j p_ij k_j), the probe's numbers equal the pattern route's, and no sink outlives
the probe, also when it fails."""

from __future__ import annotations

import pytest
import torch

from models import build_model, get_preset
from models.attention import FLASH_CPU
from probes import entropy
from probes.rows import qk as rows_qk

needs_flash = pytest.mark.skipif(FLASH_CPU is None, reason="this torch has no fused CPU kernel")


def random_model(seed: int = 0, qk_gain: float = 1.0, **overrides):
    torch.manual_seed(seed)
    model = build_model(get_preset("tiny_shakespeare_gpt_small", dropout=0.0, **overrides)).eval()
    with torch.no_grad():
        for block in model.blocks:
            for head in block.attention.heads:
                head.W_Q.mul_(qk_gain)
    return model


def tokens_for(model, batch: int, pos: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=torch.Generator().manual_seed(seed))


class Recorder:
    """A sink that keeps what it is handed and lets the pass go on."""

    def __init__(self, ends_forward: bool = False):
        self.ends_forward = ends_forward
        self.calls: list[tuple] = []

    def __call__(self, q, k, lse, weighted_k):
        self.calls.append((q, k, lse, weighted_k))


@needs_flash
@pytest.mark.parametrize("ends_forward", [False, True])
def test_a_sink_sees_the_papers_statistics_and_the_output_is_unchanged(ends_forward):
    model = random_model(qk_gain=3.0)
    tokens = tokens_for(model, 2, model.cfg.n_ctx)
    with torch.inference_mode():
        before = model(tokens)
        sink = Recorder(ends_forward)
        model.blocks[1].attention.softmax_sink = sink
        try:
            after = model(tokens)
        finally:
            model.blocks[1].attention.softmax_sink = None
    assert torch.allclose(after, before, atol=1e-6, rtol=0)
    (q, k, lse, weighted_k), = sink.calls
    scale = model.blocks[1].attention.scale
    scores = torch.einsum("bqhe,bkhe->bhqk", q.double(), k.double()) / scale  # [batch head q k]
    n = scores.shape[-1]
    scores.masked_fill_(torch.ones(n, n, dtype=torch.bool).triu_(1), float("-inf"))
    assert torch.allclose(lse.double(), scores.logsumexp(-1), atol=1e-5, rtol=0)
    expected = scores.softmax(-1) @ k.double().transpose(1, 2)  # [batch head q d_head]
    assert torch.allclose(weighted_k.double(), expected, atol=1e-5, rtol=0)


@needs_flash
@pytest.mark.parametrize("qk_gain", [0.0, 1.0, 4.0])
def test_the_sink_route_gives_the_pattern_routes_entropy(qk_gain, monkeypatch):
    model = random_model(seed=1, qk_gain=qk_gain, n_ctx=48)
    tokens = tokens_for(model, 3, 48, seed=1)
    handed = []
    original = rows_qk.SoftmaxSink.__call__
    monkeypatch.setattr(rows_qk.SoftmaxSink, "__call__",
                        lambda self, q, k, lse, wk: handed.append(lse is not None) or original(self, q, k, lse, wk))
    via_sink = entropy.collect_stats(model, tokens, route="qk", evidence=False)
    assert via_sink.route == "qk" and handed == [True] * model.cfg.n_layers  # one window batch
    pattern = entropy.collect_stats(model, tokens, route="pattern", evidence=False)
    for layer in range(model.cfg.n_layers):
        for name in ("entropy", "normalized", "nonfinite"):
            x, y = via_sink.sums[layer][name] / via_sink.rows, pattern.sums[layer][name] / pattern.rows
            assert torch.allclose(x, y, atol=1e-6, rtol=0), (layer, name, x, y)
    assert all(block.attention.softmax_sink is None for block in model.blocks)


@needs_flash
def test_the_last_wanted_layer_ends_the_pass_and_later_blocks_never_run():
    model = random_model(n_ctx=32)
    ran = []
    for l, block in enumerate(model.blocks):
        block.mlp.register_forward_pre_hook(lambda module, args, l=l: ran.append(l))
    stats = entropy.collect_stats(model, tokens_for(model, 2, 32), layers=[0, 1], route="qk",
                                  evidence=False, batch_size=2)
    check = list(range(model.cfg.n_layers))  # the q/k route's check window runs whole
    assert stats.route == "qk" and ran == check + [0]  # layer 1's MLP and everything after: skipped


def test_without_the_kernel_the_sink_gets_none_and_the_numbers_hold(monkeypatch):
    """float64 (the kernel is float32 only) and a torch without the op: the sink is handed no
    statistics, the probe reduces from q and k itself, and agrees with the pattern route."""
    model = random_model(n_ctx=24).double()
    tokens = tokens_for(model, 2, 24, seed=2)
    handed = []
    original = rows_qk.SoftmaxSink.__call__
    monkeypatch.setattr(rows_qk.SoftmaxSink, "__call__",
                        lambda self, q, k, lse, wk: handed.append(lse) or original(self, q, k, lse, wk))
    for patch_op in (False, True):
        if patch_op:
            monkeypatch.setattr("models.attention.FLASH_CPU", None)
            model = model.float()
        handed.clear()
        via_sink = entropy.collect_stats(model, tokens, route="qk", evidence=False)
        pattern = entropy.collect_stats(model, tokens, route="pattern", evidence=False)
        assert handed == [None] * model.cfg.n_layers
        grid_a, grid_b = via_sink.mean("entropy"), pattern.mean("entropy")
        assert torch.allclose(grid_a, grid_b, atol=1e-6, rtol=0), (grid_a, grid_b)


@needs_flash
def test_no_sink_outlives_a_failing_probe(monkeypatch):
    model = random_model(n_ctx=24)

    def broken(self, *args, **kwargs):
        raise RuntimeError("reduction failed")
    monkeypatch.setattr(entropy.PatternStats, "update_qk", broken)
    with pytest.raises(RuntimeError, match="reduction failed"):
        entropy.collect_stats(model, tokens_for(model, 1, 24), route="qk", evidence=False)
    assert all(block.attention.softmax_sink is None for block in model.blocks)
    assert all(not hook._forward_hooks for hook in model.hook_dict.values())


def test_a_layer_asked_for_twice_is_reduced_once():
    model = random_model(n_ctx=24)
    tokens = tokens_for(model, 1, 24)
    twice = entropy.collect_stats(model, tokens, layers=[1, 0, 1], route="qk", evidence=False)
    once = entropy.collect_stats(model, tokens, layers=[1, 0], route="qk", evidence=False)
    assert twice.layers == [1, 0] and twice.rows == once.rows == 24
    assert torch.equal(twice.mean("entropy"), once.mean("entropy"))
