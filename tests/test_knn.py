"""The panelled all-rows cosine search (probes.knn) equals a straightforward full fp32 search: on
random tables of awkward shapes, cross tables, tables whose near-equal cosines the bf16 pass alone
orders wrongly, rows whose candidates overflow (full fp32 fallback), float64, zero rows, NaN."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from probes import knn
from probes.common import ProbeInputError

PASSES = ["fp32", "bf16"]


def cosines(queries: torch.Tensor, keys: torch.Tensor, exclude_self: bool = True) -> torch.Tensor:
    """The whole [n m] cosine matrix in fp32, the diagonal masked with -inf."""
    q = queries / queries.norm(dim=1, keepdim=True).clamp_min(1e-12)
    kk = keys / keys.norm(dim=1, keepdim=True).clamp_min(1e-12)
    sims = q @ kk.T  # [n m]
    if exclude_self:
        n = min(sims.shape)
        sims[range(n), range(n)] = -math.inf
    return sims


def reference(queries: torch.Tensor, keys: torch.Tensor, k: int, exclude_self: bool = True):
    return cosines(queries, keys, exclude_self).topk(k, dim=1)


def assert_same(found, expected, atol=1e-6):
    assert torch.equal(found[1], expected[1])
    torch.testing.assert_close(found[0], expected[0], atol=atol, rtol=0)


def assert_equivalent(found, sims: torch.Tensor, k: int):
    """Where exact or fp32-rounding ties make the ids ambiguous: the cosines equal the reference
    top k and every id is a distinct, allowed key whose reference cosine is the one reported."""
    values, ids = found
    torch.testing.assert_close(values, sims.topk(k, dim=1).values, atol=1e-6, rtol=0)
    torch.testing.assert_close(sims.gather(1, ids), values, atol=1e-6, rtol=0)  # -inf for self
    assert all(len(set(row)) == k for row in ids.tolist())


# a unit-vector cosine summed in fp32 over d=32 terms is off by at most ~d * 2^-24 = 2e-6 from the
# exact one; cosines closer than this are ties the search may order either way
COSINE_ERROR = 1e-5


def misplaced(ids: torch.Tensor, table: torch.Tensor, k: int) -> int:
    """How many (row, rank) places hold a key whose exact (float64) cosine differs by more than
    COSINE_ERROR from the rank-th largest exact one: the order is checked where cosines differ by
    more than float error, and keys within it of each other are a tie (compared as a set)."""
    exact = cosines(table.double(), table.double())  # [n n], self masked with -inf
    return int(((exact.gather(1, ids) - exact.topk(k, dim=1).values).abs() > COSINE_ERROR).sum())


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("first_pass", PASSES)
@pytest.mark.parametrize("n, d, k, chunk", [
    (300, 16, 5, 64),    # 300 is not a multiple of the panel height
    (517, 32, 1, 100),   # k = 1
    (120, 8, 119, 37),   # k = n - 1: every other row, in order
    (90, 12, 4, 1024),   # one panel
    (257, 768, 10, 128),  # GPT-2 width
])
def test_self_search_equals_the_full_fp32_search(first_pass, n, d, k, chunk):
    table = randn(n, d, seed=n)
    assert_same(knn.all_knn(table, k=k, chunk_size=chunk, first_pass=first_pass), reference(table, table, k))


@pytest.mark.parametrize("first_pass", PASSES)
def test_slices_smaller_than_a_panel_change_nothing(first_pass, monkeypatch):
    monkeypatch.setattr(knn, "SLICE", 7)  # the first panel's columns are folded 7 at a time
    table = randn(300, 16, seed=11)
    assert_same(knn.all_knn(table, k=5, chunk_size=64, first_pass=first_pass), reference(table, table, 5))


@pytest.mark.parametrize("first_pass", PASSES)
@pytest.mark.parametrize("n, m", [(300, 333), (400, 123), (123, 400)])
def test_cross_tables_of_different_sizes(first_pass, n, m):
    queries, keys = randn(n, 24, seed=1), randn(m, 24, seed=2)
    found = knn.all_knn(queries, keys, 4, chunk_size=50, first_pass=first_pass)
    assert_same(found, reference(queries, keys, 4))
    kept_self = knn.all_knn(queries, keys, 4, chunk_size=50, first_pass=first_pass, exclude_self=False)
    assert_same(kept_self, reference(queries, keys, 4, exclude_self=False))


def test_self_not_excluded_finds_itself_first():
    table = randn(200, 16, seed=3)
    values, ids = knn.all_knn(table, k=3, chunk_size=64, exclude_self=False)
    assert torch.equal(ids[:, 0], torch.arange(200))
    assert_same((values, ids), reference(table, table, 3, exclude_self=False))


def tight_cluster(n: int, d: int = 32, seed: int = 4) -> torch.Tensor:
    """Rows base + 0.02 noise: every cosine lies in ~[0.999, 1), where bf16 (spacing 2^-8 below 1)
    rounds most of them to the same few values."""
    base = randn(1, d, seed=seed)
    return base + 0.02 * randn(n, d, seed=seed + 1)


def bf16_only(table: torch.Tensor, k: int) -> torch.Tensor:
    unit = knn.unit_table(table).bfloat16()
    sims = (unit @ unit.T).float()  # [n n]
    sims.fill_diagonal_(-math.inf)
    return sims.topk(k, dim=1).indices


@pytest.fixture
def fallback_rows(monkeypatch) -> list[int]:
    """How many rows each call of the full fp32 fallback searched."""
    calls: list[int] = []
    full_search = knn.chunked_search

    def spy(*args, rows, **kwargs):
        calls.append(len(rows))
        return full_search(*args, rows=rows, **kwargs)

    monkeypatch.setattr(knn, "chunked_search", spy)
    return calls


@pytest.mark.parametrize("n", [60, 150])  # every key kept / candidates overflow what is kept
def test_near_equal_cosines_bf16_alone_misorders_the_result_does_not(n, fallback_rows):
    table = tight_cluster(n)
    assert misplaced(bf16_only(table, 5), table, 5) > 0  # the first pass alone is wrong beyond float error
    values, ids = knn.all_knn(table, k=5, chunk_size=32, first_pass="bf16")
    assert misplaced(ids, table, 5) == 0 and all(len(set(row)) == 5 for row in ids.tolist())
    torch.testing.assert_close(values, reference(table, table, 5).values, atol=1e-6, rtol=0)
    # n=60 keeps all 59 keys, so rescoring alone decides; at n=150 every row's 59 kept scores
    # are within the margin, so every row is searched again in full fp32
    assert fallback_rows == ([] if n == 60 else [n])


def test_only_rows_whose_candidates_overflow_fall_back(monkeypatch, fallback_rows):
    table = randn(400, 768, seed=5)
    monkeypatch.setattr(knn, "EXTRA_CANDIDATES", 6)
    assert_same(knn.all_knn(table, k=3, chunk_size=128, first_pass="bf16"), reference(table, table, 3))
    assert len(fallback_rows) == 1 and 0 < fallback_rows[0] < 400


@pytest.mark.parametrize("first_pass", PASSES)
def test_duplicate_rows_give_exact_cosines_and_valid_ids(first_pass):
    """Exact ties: which of two equal rows comes first is unspecified, the cosines are not."""
    table = randn(100, 16, seed=6)
    table[50:] = table[:50] * 2  # row i + 50 points where row i does
    values, ids = knn.all_knn(table, k=4, chunk_size=32, first_pass=first_pass)
    assert_equivalent((values, ids), cosines(table, table), 4)
    assert torch.equal(ids[:50, 0], torch.arange(50, 100))  # its twin, cosine 1, is first
    torch.testing.assert_close(values[:, 0], torch.ones(100), atol=1e-6, rtol=0)


@pytest.mark.parametrize("first_pass", PASSES)
def test_zero_rows_have_cosine_zero(first_pass):
    table = torch.zeros(40, 4)
    table[0, 0], table[1, 0], table[2, 1] = 1.0, -3.0, 2.0  # rows 3.. are zero
    values, ids = knn.all_knn(table, k=2, chunk_size=16, first_pass=first_pass)
    assert values[0].tolist() == [0.0, 0.0] and set(ids[0].tolist()) <= set(range(2, 40))
    assert values[5].tolist() == [0.0, 0.0]


def test_float64_tables_stay_float64():
    table = randn(300, 16, seed=7, dtype=torch.float64)
    for first_pass in PASSES:  # float64 is never rounded to bf16
        found = knn.all_knn(table, k=5, chunk_size=64, first_pass=first_pass)
        assert found[0].dtype == torch.float64
        assert_same(found, reference(table, table, 5), atol=1e-12)


@pytest.mark.parametrize("first_pass", PASSES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_or_inf_in_a_table_is_an_error(first_pass, bad):
    table = randn(300, 8, seed=8)
    table[250, 3] = bad
    with pytest.raises(ProbeInputError, match="1 NaN/inf"):
        knn.all_knn(table, k=3, chunk_size=64, first_pass=first_pass)
    keys = randn(200, 8, seed=9)
    keys[7, 0] = bad
    with pytest.raises(ProbeInputError, match="1 NaN/inf"):
        knn.all_knn(randn(50, 8), keys, k=3, first_pass=first_pass)
    with pytest.raises(ProbeInputError, match="1 NaN/inf"):  # in the query table of a cross search
        knn.all_knn(keys, randn(50, 8), k=3, chunk_size=64, first_pass=first_pass)


def test_progress_bar_goes_to_stderr(capsys):
    table = randn(300, 8, seed=12)
    found = knn.all_knn(table, k=3, chunk_size=64, progress=True)
    assert "neighbours" in capsys.readouterr().err
    assert_same(found, reference(table, table, 3))


def test_bad_arguments_are_one_line_errors():
    table = randn(20, 4)
    for kwargs, message in [({"k": 20}, "k must be between 1 and 19"), ({"k": 0}, "k must be between"),
                            ({"chunk_size": 0}, "chunk_size"), ({"first_pass": "fp16"}, "first_pass must be one of")]:
        with pytest.raises(ProbeInputError, match=message):
            knn.all_knn(table, **{"k": 3, **kwargs})
    with pytest.raises(ProbeInputError, match="width 4 but key rows 5"):
        knn.all_knn(table, randn(20, 5), k=3)


def test_bf16_error_bounds_hold():
    u = 2.0 ** -8
    bound = knn.bf16_cosine_error_bound(768)
    assert 3 * u < bound < 3 * u + 1e-4  # 2u from the rows, u from the output, the rest tiny
    rows = knn.unit_table(randn(512, 768, seed=10))
    rows[0] = knn.unit_table(torch.ones(2, 768))[0]  # every element rounded the same way
    exact = rows @ rows.T  # [512 512]
    low = (rows.bfloat16() @ rows.bfloat16().T).float()
    error = (low - exact).abs()
    assert float(error.max()) <= bound
    e = knn.bf16_rounding_norms(rows)  # [512], ~u/2 for random rows
    assert float(e.max()) <= u * (1 + 1e-3) and float(e.mean()) < 0.6 * u
    per_pair = knn.bf16_additive_bound(e[:, None], e[None, :], 768) + knn.BF16_OUTPUT * low.abs()
    assert bool((error <= per_pair).all()) and float(per_pair.mean()) < bound / 2


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 40), m=st.integers(2, 40), d=st.integers(1, 6), k=st.integers(1, 39),
       block=st.integers(1, 50), cross=st.booleans(), first_pass=st.sampled_from(PASSES),
       seed=st.integers(0, 1000))
def test_any_shape_equals_the_reference(n, m, d, k, block, cross, first_pass, seed):
    queries = randn(n, d, seed=seed)
    keys = randn(m, d, seed=seed + 1) if cross else queries
    k = min(k, keys.shape[0] - 1)
    found = knn.all_knn(queries, keys if cross else None, k, chunk_size=block, first_pass=first_pass)
    assert_equivalent(found, cosines(queries, keys), k)  # tiny d: ties at fp32 rounding happen
