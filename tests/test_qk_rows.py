"""The q/k route of the attention probes: the same numbers as reducing the pattern, no pattern.

Reference: `PatternStats.update` on the model's own hook_pattern (the route the probes took
before, itself checked against the series' formula and TransformerLens). Every statistic of
every head must agree to 1e-6, on random models, collapsed heads, NaN heads, windows of every
length, and the route must fall back where the pattern is not softmax(q k^T / scale + mask).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from models import build_model, get_preset
from probes import degenerate, entropy
from probes.common import ProbeInputError
from probes.rows import qk as rows_qk, stats as rows_stats


def random_model(preset: str = "tiny_shakespeare_gpt_small", seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return build_model(get_preset(preset, dropout=0.0, **overrides)).eval()


def both_routes(model, tokens, **kwargs):
    qk = entropy.collect_stats(model, tokens, route="qk", **kwargs)
    pattern = entropy.collect_stats(model, tokens, route="pattern", **kwargs)
    assert (qk.route, pattern.route) == ("qk", "pattern")
    return qk, pattern


def assert_same_sums(a: entropy.PatternStats, b: entropy.PatternStats, atol: float = 1e-6,
                     names: tuple[str, ...] = entropy.SUMS) -> None:
    for layer in a.layers:
        for name in names:
            x, y = a.sums[layer][name] / max(a.rows, 1), b.sums[layer][name] / max(b.rows, 1)
            assert torch.allclose(x, y, atol=atol, equal_nan=True), (layer, name, x, y)
    assert torch.allclose(a.per_position(), b.per_position(), atol=atol, equal_nan=True)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**16), batch=st.integers(1, 3), pos=st.integers(1, 40),
       qk_gain=st.floats(0.0, 30.0))
def test_qk_route_equals_pattern_route(seed, batch, pos, qk_gain):
    """Random weights with W_Q scaled from 0 (uniform heads) to 30x (near one-hot): equal sums,
    blockwise with evidence and, for entropy alone, from the fused kernel (its float32
    cancellation sends the near one-hot rows the exact way: `probes.rows.qk.rows_to_redo`).

    Both routes run the model on its explicit attention path here, so that they reduce the same
    q, k and pattern: at 30x gain the fused kernel's last-bit differences in layer 0 grow through
    the residual stream to ~1e-5 by layer 3, a difference of forward passes, not of reductions."""
    model = random_model("transformer4_rms_small", seed)  # ctx 16: windows of 16 and a shorter tail
    model.set_attn_impl("explicit")
    with torch.no_grad():
        for block in model.blocks:
            for head in block.attention.heads:
                head.W_Q.mul_(qk_gain)
    tokens = torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=torch.Generator().manual_seed(seed))
    qk, pattern = both_routes(model, tokens)
    assert_same_sums(qk, pattern)
    fused = entropy.collect_stats(model, tokens, route="qk", evidence=False)
    assert_same_sums(fused, pattern, names=("entropy", "normalized", "nonfinite"))


def test_blocks_and_chunks_cover_every_row(monkeypatch):
    """Query blocks of 5 rows and chunks of one window: the block edges (diagonal, sub-diagonal
    across a block boundary) land where the whole-pattern reduction puts them."""
    model = random_model(n_ctx=32)
    tokens = torch.randint(0, model.cfg.d_vocab, (3, 32), generator=torch.Generator().manual_seed(1))
    whole = entropy.collect_stats(model, tokens, route="qk")
    monkeypatch.setattr(rows_qk, "QUERY_BLOCK", 5)
    monkeypatch.setattr(rows_qk, "CHUNK_ELEMENTS", 1)
    small_blocks, pattern = both_routes(model, tokens)
    assert_same_sums(small_blocks, pattern)
    assert_same_sums(small_blocks, whole)


def test_hand_set_scores_give_the_formula():
    """One head, q = k = identity rows scaled by c: row i's scores are c on key i, 0 elsewhere,
    so p_ii = e^c / (e^c + i) and H_i follows on paper."""
    c, n = 3.0, 6
    q = torch.zeros(1, n, 1, n)
    q[0, :, 0, :] = torch.eye(n) * math.sqrt(c)
    rows = rows_qk.qk_row_stats(q, q.clone(), scale=1.0)
    for i in range(n):
        p_self, p_other = math.exp(c) / (math.exp(c) + i), 1 / (math.exp(c) + i)
        expected = -(p_self * math.log(p_self) + i * p_other * math.log(p_other))
        assert rows["entropy"][0, 0, i].item() == pytest.approx(expected, abs=1e-6)
        assert rows["diag"][0, 0, i].item() == pytest.approx(p_self, abs=1e-6)
        assert rows["max_prob"][0, 0, i].item() == pytest.approx(p_self, abs=1e-6)
        assert rows["first"][0, 0, i].item() == pytest.approx(p_self if i == 0 else p_other, abs=1e-6)
        assert rows["subdiag"][0, 0, i].item() == pytest.approx(0.0 if i == 0 else p_other, abs=1e-6)


def test_huge_scores_keep_entropy_exact():
    """A collapsed head with scores ~1e4: computing ln sum e^s - sum p s on unshifted scores would
    lose ~1e-3 to cancellation in float32; shifted by the row max it stays ~0."""
    n = 8
    q = torch.zeros(1, n, 1, n)
    q[0, :, 0, :] = torch.eye(n) * 100.0  # s_ii = 1e4
    rows = rows_qk.qk_row_stats(q, q.clone(), scale=1.0)
    assert rows["entropy"].abs().max().item() < 1e-6


def test_nan_head_is_nan_on_both_routes_and_others_are_not():
    model = random_model()
    with torch.no_grad():
        model.blocks[0].attention.heads[1].W_K[0, 0] = float("nan")
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 12), generator=torch.Generator().manual_seed(2))
    qk, pattern = both_routes(model, tokens)
    assert qk.sums[0]["nonfinite"][1] > 0 and qk.sums[0]["nonfinite"].tolist() == pattern.sums[0]["nonfinite"].tolist()
    assert_same_sums(qk, pattern)
    verdicts = [degenerate.run(model, tokens, route=r).verdicts for r in ("qk", "pattern")]
    assert verdicts[0] == verdicts[1] and verdicts[0][0][1] == "diverged"


def test_auto_takes_qk_for_long_windows_on_our_models_and_the_results_match_run(monkeypatch):
    model = random_model()
    tokens = torch.randint(0, model.cfg.d_vocab, (4, model.cfg.n_ctx), generator=torch.Generator().manual_seed(5))
    assert entropy.collect_stats(model, tokens).route == "pattern"  # 16 tokens: the pattern is cheap
    monkeypatch.setattr(rows_stats, "QK_MIN_CONTEXT", 8)
    assert entropy.collect_stats(model, tokens).route == "qk"
    auto, pattern = entropy.run(model, tokens, per_position=True), entropy.run(model, tokens, route="pattern",
                                                                              per_position=True)
    for grid in ("entropy", "entropy_normalized", "per_position"):
        assert torch.allclose(torch.tensor(getattr(auto, grid)), torch.tensor(getattr(pattern, grid)), atol=1e-6)
    a, b = degenerate.run(model, tokens), degenerate.run(model, tokens, route="pattern")
    assert a.verdicts == b.verdicts
    for name, grid in a.evidence.items():
        if all(isinstance(v, float) for row in grid for v in row):
            assert torch.allclose(torch.tensor(grid), torch.tensor(b.evidence[name]), atol=1e-6), name


def test_a_pattern_that_is_not_softmax_qk_falls_back(monkeypatch):
    """The model's scale no longer matches its config (as rotary or ALiBi would not match
    q k^T): auto takes the pattern route and its numbers are the true ones; qk is refused."""
    model = random_model()
    for block in model.blocks:
        block.attention.scale *= 3.0
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 10), generator=torch.Generator().manual_seed(4))
    assert rows_qk.qk_path_scale(model, tokens, [0, 1]) is None
    monkeypatch.setattr(rows_stats, "QK_MIN_CONTEXT", 0)
    auto = entropy.collect_stats(model, tokens)
    assert auto.route == "pattern"
    assert_same_sums(auto, entropy.collect_stats(model, tokens, route="pattern"))
    with pytest.raises(ProbeInputError, match="not softmax"):
        entropy.collect_stats(model, tokens, route="qk")
    with pytest.raises(ValueError, match="route must be"):
        entropy.collect_stats(model, tokens, route="fast")


def test_qk_route_keeps_the_model_on_its_fused_path(monkeypatch):
    monkeypatch.setattr(rows_stats, "QK_MIN_CONTEXT", 0)
    model = random_model()
    calls = []
    for block in model.blocks:
        for path in ("fused", "explicit"):
            original = getattr(block.attention, path)
            setattr(block.attention, path, lambda *a, o=original, p=path: calls.append(p) or o(*a))
    tokens = torch.randint(0, model.cfg.d_vocab, (2, model.cfg.n_ctx), generator=torch.Generator().manual_seed(6))
    stats = entropy.collect_stats(model, tokens)  # the check window takes the explicit path once
    n = model.cfg.n_layers  # the pass stops at the last layer's hook_k, before its attention
    assert stats.route == "qk" and calls == ["explicit"] * n + ["fused"] * (n - 1)


@pytest.mark.parametrize("positions, route", [("standard", "qk"), ("rotary", "pattern")])
def test_bridge_pattern_is_checked_not_assumed(positions, route, monkeypatch):
    """TransformerLens' native bridge: plain attention takes the q/k route (its scale left at -1
    means sqrt(d_head)); with rotary embeddings, applied after hook_q, the check fails and the
    pattern route is taken. Both give the numbers of the bridge's own hook_pattern."""
    from transformer_lens import TransformerBridge

    cfg = {"n_layers": 2, "d_model": 32, "n_heads": 4, "d_head": 8, "d_mlp": 64, "d_vocab": 50,
           "n_ctx": 16, "act_fn": "gelu", "normalization_type": "LN", "seed": 0}
    if positions == "rotary":
        cfg.update(positional_embedding_type="rotary", rotary_dim=8)
    bridge = TransformerBridge.boot_native(cfg).eval()
    monkeypatch.setattr(rows_stats, "QK_MIN_CONTEXT", 0)
    tokens = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(7))
    auto, pattern = entropy.collect_stats(bridge, tokens), entropy.collect_stats(bridge, tokens, route="pattern")
    assert auto.route == route
    assert_same_sums(auto, pattern)
