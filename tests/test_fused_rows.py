"""The fused-kernel entropy (`probes.rows.qk.fused_row_entropy`) and the early stop of the forward pass
(`probes.rows.stats.StopForward`): same numbers as the explicit pattern route (over random models with
W_Q gain 0..30: test_qk_rows.test_qk_route_equals_pattern_route), exact rows where float32
cancellation would not be, the blockwise route when the private op is missing, and a model
left unhooked and usable after a pass cut short."""

from __future__ import annotations

import math

import pytest
import torch

from models import build_model, get_preset
from probes import entropy
from probes.rows import qk as rows_qk, stats as rows_stats

needs_flash = pytest.mark.skipif(rows_qk.FLASH_CPU is None, reason="this torch has no fused CPU kernel")


def random_model(preset: str = "tiny_shakespeare_gpt_small", seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return build_model(get_preset(preset, dropout=0.0, **overrides)).eval()


def entropy_only(model, tokens, route: str, **kwargs) -> rows_stats.PatternStats:
    stats = entropy.collect_stats(model, tokens, route=route, evidence=False, **kwargs)
    assert stats.route == route
    return stats


def assert_same_entropy(a: rows_stats.PatternStats, b: rows_stats.PatternStats, atol: float = 1e-6) -> None:
    assert (a.rows, a.multi_rows) == (b.rows, b.multi_rows)
    for layer in a.layers:
        for name in ("entropy", "normalized", "nonfinite"):
            x, y = a.sums[layer][name] / a.rows, b.sums[layer][name] / b.rows
            assert torch.allclose(x, y, atol=atol, rtol=0, equal_nan=True), (layer, name, x, y)


@needs_flash
def test_fused_rows_match_the_blockwise_rows_on_a_longer_window():
    """Per row, on 200 positions of random q, k (scores of a few units): within the tolerance a
    fused row is kept at, and row 0 (one key) exactly 0."""
    gen = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 200, 3, 16, generator=gen) * 2, torch.randn(2, 200, 3, 16, generator=gen)
    fused = rows_qk.fused_row_entropy(q, k, 4.0)
    exact = rows_qk.qk_row_stats(q.double(), k.double(), 4.0)["entropy"]
    assert fused is not None and fused.shape == exact.shape == (2, 3, 200)
    assert (fused.double() - exact).abs().max().item() < 3 * rows_qk.ROW_TOL
    assert bool((fused[..., 0] == 0).all())


@needs_flash
def test_hand_set_scores_give_the_formula_on_the_fused_route():
    """q = k = sqrt(c) e_i: p_ii = e^c / (e^c + i), H_i on paper (as test_qk_rows, entropy only)."""
    c, n = 3.0, 6
    q = torch.zeros(1, n, 1, n)
    q[0, :, 0, :] = torch.eye(n) * math.sqrt(c)
    rows = rows_qk.qk_row_stats(q, q.clone(), scale=1.0, evidence=False)["entropy"]
    for i in range(n):
        p_self, p_other = math.exp(c) / (math.exp(c) + i), 1 / (math.exp(c) + i)
        expected = -(p_self * math.log(p_self) + i * p_other * math.log(p_other))
        assert rows[0, 0, i].item() == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("bounds, redo", [
    ([0, 0, 3, 2, 1], []),  # 9 + 4 + 1 = 14 within (MEAN_TOL * 4 rows)^2 = 16
    ([0, 0, 4, 2, 1], [2]),  # 16 + 4 + 1 = 21: dropping the largest leaves 5
    ([0, 2, 0, 0, 0], []),  # row 1 weighs 1 / ln 2: (2 / 0.693)^2 = 8.3
    ([0, 3, 0, 0, 0], [1]),  # (3 / 0.693)^2 = 18.7
    ([0, 0, 0, 11, 0], [3]),  # past ROW_TOL on its own
    ([0, 0, float("nan"), 0, 0], [2]),
])
def test_rows_to_redo_on_paper(bounds, redo, monkeypatch):
    monkeypatch.setattr(rows_qk, "MEAN_TOL", 1.0)
    monkeypatch.setattr(rows_qk, "ROW_TOL", 10.0)
    bound = torch.tensor(bounds)[None, None]  # [1 1 5]
    picked = rows_qk.rows_to_redo(bound, torch.tensor([[True]]))[0, 0]
    assert picked.nonzero().flatten().tolist() == redo
    assert bool(rows_qk.rows_to_redo(bound, torch.tensor([[False]])).all())  # a non-finite head: all


def test_rows_to_redo_budgets_each_head_over_the_whole_batch(monkeypatch):
    """Two windows, two heads: head 0 spreads 4 + 4 over 8 rows (within (1 * 2 * 3)^2 = 36), head 1
    puts 25 + 16 in one window: its largest row goes."""
    monkeypatch.setattr(rows_qk, "MEAN_TOL", 1.0)
    monkeypatch.setattr(rows_qk, "ROW_TOL", 10.0)
    bound = torch.zeros(2, 2, 4)
    bound[0, 0, 2], bound[1, 0, 3] = 2.0, 2.0
    bound[1, 1, 2], bound[1, 1, 3] = 5.0, 4.0
    picked = rows_qk.rows_to_redo(bound, torch.ones(2, 2, dtype=torch.bool))
    assert picked.nonzero().tolist() == [[1, 1, 2]]


@needs_flash
def test_huge_scores_are_recomputed_exactly(monkeypatch):
    """Scores ~1e4: lse - q.out would lose ~1e-3 in float32; the bound sends every such row to
    the exact computation, and the entropy stays ~0."""
    n = 8
    q = torch.zeros(1, n, 1, n)
    q[0, :, 0, :] = torch.eye(n) * 100.0  # s_ii = 1e4
    redone = []
    original = rows_qk.exact_rows
    monkeypatch.setattr(rows_qk, "exact_rows", lambda q, k, s, rows, e: redone.append(int(rows.sum())) or
                        original(q, k, s, rows, e))
    rows = rows_qk.qk_row_stats(q, q.clone(), scale=1.0, evidence=False)["entropy"]
    assert rows.abs().max().item() < 1e-6 and redone == [n]


@needs_flash
def test_non_finite_heads_are_nan_on_the_fused_route_as_on_the_blockwise_one():
    gen = torch.Generator().manual_seed(4)
    q, k = torch.randn(2, 10, 3, 4, generator=gen), torch.randn(2, 10, 3, 4, generator=gen)
    k[1, 4, 2, 0] = float("nan")  # head 2 of window 1: rows 4.. see it
    q[0, 7, 0, 1] = float("inf")  # head 0 of window 0: row 7 only
    fused = rows_qk.qk_row_stats(q, k, 2.0, evidence=False)["entropy"]
    blockwise = rows_qk.qk_row_stats(q, k, 2.0, fused=False, evidence=False)["entropy"]
    assert torch.equal(fused.isnan(), blockwise.isnan()) and int(fused.isnan().sum()) == 6 + 1
    assert torch.allclose(fused, blockwise, atol=1e-5, equal_nan=True)


def test_without_the_fused_op_the_blockwise_route_gives_the_same_numbers(monkeypatch):
    model = random_model(n_ctx=24)
    tokens = torch.randint(0, model.cfg.d_vocab, (3, 24), generator=torch.Generator().manual_seed(5))
    with_op = entropy_only(model, tokens, "qk")
    monkeypatch.setattr(rows_qk, "FLASH_CPU", None)
    q = torch.randn(1, 5, 2, 4)
    assert rows_qk.fused_row_entropy(q, q, 2.0) is None
    without = entropy_only(model, tokens, "qk")
    assert_same_entropy(with_op, without)
    assert_same_entropy(without, entropy_only(model, tokens, "pattern"))


# ---------------------------------------------------------------- early stop

def spy_on_mlps(model) -> list[int]:
    ran: list[int] = []
    for l, block in enumerate(model.blocks):
        block.mlp.register_forward_pre_hook(lambda module, args, l=l: ran.append(l))
    return ran


@pytest.mark.parametrize("route", ["qk", "pattern"])
def test_forward_stops_after_the_last_wanted_layer_and_leaves_the_model_usable(route):
    model = random_model()
    model.train()
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 16), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        model.eval()
        before = model(tokens)
        model.train()
    ran = spy_on_mlps(model)
    stats = entropy.collect_stats(model, tokens, layers=[1], route=route, batch_size=1)
    assert stats.route == route and stats.windows == 2
    check = [0, 1, 2, 3] if route == "qk" else []  # the q/k route's check runs one whole window
    assert ran == check + [0, 0]  # block 1's MLP and all after it never ran, in either window
    assert model.training  # mode put back
    assert all(not hook._forward_hooks for hook in model.hook_dict.values())
    model.eval()
    del ran[:]
    with torch.no_grad():
        assert torch.equal(model(tokens), before)
    assert ran == [0, 1, 2, 3]  # a plain forward runs every block again


def test_early_stop_on_a_transformer_bridge_leaves_it_unhooked_and_equal():
    from transformer_lens import TransformerBridge

    bridge = TransformerBridge.boot_native({"n_layers": 3, "d_model": 32, "n_heads": 4, "d_head": 8,
                                            "d_mlp": 64, "d_vocab": 50, "n_ctx": 16, "act_fn": "gelu",
                                            "normalization_type": "LN", "seed": 0}).eval()
    tokens = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        before = bridge(tokens)
    for route in ("qk", "pattern"):
        stats = entropy.collect_stats(bridge, tokens, layers=[0], route=route)
        assert stats.route == route
        whole = entropy.collect_stats(bridge, tokens, route=route)  # every layer: no stop before the end
        assert_same_entropy(stats, whole)  # over layer 0
    assert all(not hook._forward_hooks for hook in bridge.hook_dict.values())
    with torch.no_grad():
        assert torch.equal(bridge(tokens), before)


@needs_flash
def test_per_position_reports_take_the_blockwise_rows(monkeypatch):
    """A per-position profile over few windows shows single rows: those come from the blockwise
    reduction (float32 to ~1e-6 per row), the means alone from the fused kernel."""
    model = random_model()
    tokens = torch.randint(0, model.cfg.d_vocab, (1, 16), generator=torch.Generator().manual_seed(8))
    calls = []
    original = rows_qk.fused_row_entropy
    monkeypatch.setattr(rows_qk, "fused_row_entropy", lambda *a: calls.append(1) or original(*a))
    entropy.run(model, tokens, route="qk", per_position=True)
    assert calls == []
    entropy.run(model, tokens, route="qk")
    assert len(calls) == model.cfg.n_layers
