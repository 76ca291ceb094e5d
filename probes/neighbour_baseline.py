"""Do an embedding table's nearest neighbours mean anything? Compared with the same table shuffled.

    from probes import neighbour_baseline
    base = neighbour_baseline.shuffled_baseline(table, k=10)          # [d_vocab d]
    base.structured                    # the table's typical token is closer to its k nearest than chance
    base.token_above(0.31)             # one token's mean cosine to its k nearest, against the same bar

The statistic is a token's **mean cosine to its k nearest neighbours** (itself excluded, as
`probes.neighbours` excludes it). The baseline is the same statistic on **shuffled tables**: each
dimension (column) of the table permuted across tokens independently, `seeds` times. Shuffling
keeps every dimension's values (its mean, spread and outliers: a table whose rows all lean one way
keeps leaning) but breaks which values a token holds together, so whatever neighbourhoods remain
are those any table with these dimensions would show. Permuting whole rows would not do: it
renames tokens but leaves every cosine as it was.

A table is `structured` when its median token's statistic is above the `level` quantile (95%) of
the shuffled tokens': a random table (an untrained embedding) sits at the shuffled level, since
shuffling a table of independent draws gives another such table. With more than `max_rows`
tokens, a fixed random sample of `max_rows` rows is the query set (against every key), so a
GPT-2-sized table costs a few [256 50257] products.

For two tables (`cross`: input rows searched in the output table) both are shuffled,
independently, and row i's own key is excluded as the search excludes the token's own id.

torch is imported where a table is measured, so that a page reads a saved `ShuffledBaseline`
without it (`probes.first_view`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from probes.errors import ProbeInputError

if TYPE_CHECKING:
    import torch

__all__ = ["ShuffledBaseline", "mean_cosine", "shuffle_dimensions", "shuffled_baseline", "topk_mean_cosine"]

SEEDS = 5
LARGE_SEEDS, LARGE_ENTRIES = 2, 4_000_000  # a table past 4M numbers (GPT-2's 50257 x 768) gets 2 seeds:
# 2 x 256 shuffled tokens still place a 95% quantile, and a shuffle of GPT-2's table takes ~3 s on one core
MAX_ROWS = 256
LEVEL = 0.95


@dataclass(frozen=True)
class ShuffledBaseline:
    """A table's median k-nearest mean cosine beside the shuffled tables' median and `level` quantile."""

    k: int
    seeds: int
    rows: int  # query rows per table (all tokens, or a sample of max_rows)
    level: float
    table_median: float  # the median token of the table itself
    shuffled_median: float  # ... of the shuffled tables (all seeds' rows together)
    shuffled_level: float  # the `level` quantile of the shuffled tables' tokens

    @property
    def structured(self) -> bool:
        """The table's typical token is closer to its neighbours than 95% of shuffled tokens are."""
        return self.table_median > self.shuffled_level

    def token_above(self, value: float) -> bool:
        """One token's k-nearest mean cosine above the shuffled tables' `level` quantile."""
        return value > self.shuffled_level

    def to_dict(self) -> dict:
        return {**asdict(self), "structured": self.structured}


def shuffle_dimensions(table: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """[n d] -> [n d]: each column's values permuted across the rows, each column independently."""
    import torch

    n = table.shape[0]
    columns = [table[torch.randperm(n, generator=generator), j] for j in range(table.shape[1])]
    return torch.stack(columns, dim=1)


def topk_mean_cosine(queries: torch.Tensor, keys: torch.Tensor, k: int,
                     own: torch.Tensor | None = None) -> torch.Tensor:
    """[r d] query rows, [m d] keys -> [r]: each query's mean cosine to its k nearest keys, key
    `own[i]` (the query's own row, when given) left out."""
    import torch

    from probes.knn import unit_rows

    sims = unit_rows(queries) @ unit_rows(keys).T  # [r m]
    if own is not None:
        sims[torch.arange(len(own)), own] = float("-inf")
    return sims.topk(k, dim=1).values.mean(dim=1)


def shuffled_baseline(queries: torch.Tensor, keys: torch.Tensor | None = None, k: int = 10, *,
                      seeds: int | None = None, max_rows: int = MAX_ROWS, level: float = LEVEL) -> ShuffledBaseline:
    """The table (queries searched in keys; `keys` None: in itself) against `seeds` shuffled copies
    (default SEEDS, LARGE_SEEDS for a table of more than LARGE_ENTRIES numbers)."""
    import torch

    from probes.knn import check_k, check_table
    same = keys is None or keys is queries
    keys = queries if keys is None else keys
    if seeds is None:
        seeds = SEEDS if keys.numel() <= LARGE_ENTRIES else LARGE_SEEDS
    check_table(queries, "query")
    check_table(keys, "key")
    if queries.shape[1] != keys.shape[1] or (not same and queries.shape[0] != keys.shape[0]):
        raise ProbeInputError(f"the query and key tables must be [n d] alike, got {tuple(queries.shape)} "
                              f"and {tuple(keys.shape)}")
    check_k(k, keys.shape[0] - 1)
    if seeds < 1 or max_rows < 1 or not 0.0 < level < 1.0:
        raise ProbeInputError(f"shuffled_baseline needs seeds >= 1, max_rows >= 1 and 0 < level < 1, got "
                              f"{seeds}, {max_rows}, {level}")
    queries, keys = queries.detach().float(), keys.detach().float()
    n = queries.shape[0]
    rows = torch.randperm(n, generator=torch.Generator().manual_seed(0))[:max_rows].sort().values
    table = topk_mean_cosine(queries[rows], keys, k, rows)
    shuffled = []
    for seed in range(seeds):
        g = torch.Generator().manual_seed(1000 + seed)
        q = shuffle_dimensions(queries, g)
        kk = q if same else shuffle_dimensions(keys, g)
        shuffled.append(topk_mean_cosine(q[rows], kk, k, rows))
    null = torch.cat(shuffled)
    return ShuffledBaseline(k=k, seeds=seeds, rows=len(rows), level=level,
                            table_median=float(table.median()), shuffled_median=float(null.median()),
                            shuffled_level=float(torch.quantile(null, level)))


def mean_cosine(neighbours: list[dict]) -> float:
    """The statistic for one token from `probes.neighbours`' result rows ({"cosine": ...}, k of them)."""
    if not neighbours:
        raise ProbeInputError("no neighbours to average")
    return sum(float(n["cosine"]) for n in neighbours) / len(neighbours)
