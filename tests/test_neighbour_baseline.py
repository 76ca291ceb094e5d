"""The shuffled-embedding baseline of the neighbour table (`probes.neighbour_baseline`): hand-built
tables whose neighbours are known (clusters: structured; independent draws, with or without a
common offset: not), its invariants, and the shipped runs' tables at step 0 and trained."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from probes import neighbours
from probes.common import ProbeInputError
from probes.neighbour_baseline import (mean_cosine, shuffle_dimensions, shuffled_baseline,
                                       topk_mean_cosine)

CHECKPOINTS = Path(__file__).resolve().parent.parent / "checkpoints"


def clusters(n_clusters: int = 4, size: int = 8, d: int = 16, noise: float = 0.3, seed: int = 0) -> torch.Tensor:
    """[n_clusters*size d]: token i sits near centre i // size (orthogonal centres of length 3, in
    random directions: a table's axes carry no meaning of their own)."""
    g = torch.Generator().manual_seed(seed)
    centres = 3.0 * torch.linalg.qr(torch.randn(d, d, generator=g))[0][:n_clusters]
    return centres.repeat_interleave(size, dim=0) + noise * torch.randn(n_clusters * size, d, generator=g)


def test_a_clustered_table_is_structured_and_each_token_finds_its_cluster():
    table = clusters()
    base = shuffled_baseline(table, k=7)
    assert base.structured and base.table_median > base.shuffled_level > base.shuffled_median
    found = topk_mean_cosine(table, table, 7, torch.arange(32))
    assert all(base.token_above(float(v)) for v in found)  # every token, not only the median one
    ids = neighbours.all_neighbours(table, k=7)[1]
    assert all(set(ids[i].tolist()) == set(range(i // 8 * 8, i // 8 * 8 + 8)) - {i} for i in range(32))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_independent_draws_are_not_structured(seed):
    table = torch.randn(65, 32, generator=torch.Generator().manual_seed(seed))  # an untrained embedding
    base = shuffled_baseline(table, k=10)
    assert not base.structured
    assert base.table_median == pytest.approx(base.shuffled_median, rel=0.1)


def test_a_common_offset_is_not_taken_for_structure():
    """Rows that all lean one way have high cosines everywhere: random directions' chance level
    calls that structure, the shuffled table (which keeps the lean) does not."""
    g = torch.Generator().manual_seed(0)
    table = 2.0 + torch.randn(65, 32, generator=g)
    best = topk_mean_cosine(table, table, 1, torch.arange(65))
    assert float(best.min()) > neighbours.chance_cosine(64, 32)  # "above chance" for every token
    assert not shuffled_baseline(table, k=10).structured


def test_shuffling_keeps_each_dimension_and_permuting_rows_changes_nothing():
    table = clusters()
    shuffled = shuffle_dimensions(table, torch.Generator().manual_seed(3))
    assert torch.equal(shuffled.sort(dim=0).values, table.sort(dim=0).values)  # each column's values kept
    assert not torch.equal(shuffled, table)
    rows = torch.randperm(32, generator=torch.Generator().manual_seed(4))  # renaming tokens is no baseline
    own = torch.arange(32)
    assert torch.allclose(topk_mean_cosine(table[rows], table[rows], 5, own)[rows.argsort()],
                          topk_mean_cosine(table, table, 5, own))


def test_two_tables_are_shuffled_each_and_own_rows_left_out():
    inputs = clusters()
    outputs = inputs + 0.1 * torch.randn(inputs.shape, generator=torch.Generator().manual_seed(5))
    assert shuffled_baseline(inputs, outputs, k=5).structured
    assert not shuffled_baseline(torch.randn(40, 16), torch.randn(40, 16), k=5).structured
    assert mean_cosine([{"cosine": 0.5}, {"cosine": 0.25}]) == pytest.approx(0.375)


def test_a_large_table_is_sampled_and_gets_fewer_seeds():
    base = shuffled_baseline(torch.randn(2000, 2001), k=3, max_rows=50)
    assert base.rows == 50 and base.seeds == 2 and not base.structured


@pytest.mark.parametrize("bad, message", [
    (dict(k=40), "k must be between 1 and 31"), (dict(keys=torch.zeros(32, 8)), "must be [n d] alike"),
    (dict(level=1.0), "0 < level < 1"), (dict(seeds=0), "seeds >= 1")])
def test_bad_arguments_are_one_line(bad, message):
    with pytest.raises(ProbeInputError, match=message.replace("[", r"\[")):
        shuffled_baseline(clusters(), **{"k": 5, **bad})


# ------------------------------------------------------------------ the shipped runs

def table_of(snapshot: Path, table: str) -> torch.Tensor:
    from models.store import load_checkpoint

    return neighbours.tables_for(load_checkpoint(snapshot).model, table)[0]


@pytest.mark.parametrize("run", ["attn1_residual", "mha4", "shakespeare_rms4"])
def test_shipped_step_0_tables_are_chance_and_trained_unembeddings_are_not(run):
    for table in ("input", "output"):
        assert not shuffled_baseline(table_of(CHECKPOINTS / run / "step_000000", table)).structured, table
    trained = sorted((CHECKPOINTS / run).glob("step_*[0-9]"))[-1]
    assert shuffled_baseline(table_of(trained, "output")).structured


def test_shipped_gpt_input_embedding_is_structured():
    assert shuffled_baseline(table_of(CHECKPOINTS / "shakespeare_gpt", "input")).structured
