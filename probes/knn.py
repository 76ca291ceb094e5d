"""Exact cosine top-k of every row of a table, against itself or a second table (pure tensors).

    values, ids = knn.all_knn(table, k=10)            # every row against the same table, self excluded
    values, ids = knn.all_knn(inputs, outputs, k=10)  # every input row against the output table

The search never builds the [n m] matrix. It walks [block block] tiles of (query rows, key rows):
- against itself (`keys` None or the same tensor) only the tiles on and above the diagonal are
  computed; a tile's similarities feed its query rows' running top-k and, transposed, its key
  rows' ones, which halves the matrix products;
- with `first_pass="bf16"` the tiles are bfloat16 products. Each row keeps its best `k +
  EXTRA_CANDIDATES` low-precision scores; every kept key whose score is within twice the error
  bound (`bf16_additive_bound`, from the rows' actual rounding, plus the output rounding) of the
  row's k-th best score is rescored exactly in fp32 and the top k of those is the answer. A row
  whose candidates might not all fit in what it kept is searched again in full fp32
  (`chunked_search`), so the result never depends on luck.
  "auto" uses bf16 only where oneDNN multiplies bf16 natively (AVX512-BF16 / AMX CPUs): on a
  plain AVX2 CPU a bf16 product is hundreds of times slower than fp32.

Ties: among exactly equal cosines the order, and which id fills the k-th place, is unspecified;
the cosines are exact either way. Cosines equal those of the fp32 product up to summation order
(~1e-7). A zero row has cosine 0 with everything; float64 tables are searched in float64.
"""

from __future__ import annotations

import math
import sys
from typing import Iterable, Sequence

import torch

from probes.common import ProbeInputError

GROUP = 128  # columns per group in the two-stage top-k of `top_k_columns`
CHUNK_BYTES = 128 << 20  # similarity budget of `chunked_search` per chunk of query rows (128 MiB)
SLICE = 2048  # rows per slice when normalising a table (small temporaries)
BLOCK = 1024  # default tile side of `all_knn`: a [1024 1024] fp32 tile is 4 MiB, cache-friendly
EXTRA_CANDIDATES = 54  # bf16 scores kept per row beyond k: a random 50304 x 768 table's rows need
# 23 candidates on average at k=10, at most 47 (11 rows past k + 32), so none falls back
RESCORE_ROWS = 128  # rows rescored at once: [128 k+54 d] gathered keys, ~25 MB at d=768


# ---------------------------------------------------------------- checks and unit rows

def check_table(table: torch.Tensor, name: str) -> None:
    if table.dim() != 2 or table.shape[0] < 2:
        raise ProbeInputError(f"the {name} table must be [d_vocab d] with d_vocab >= 2, "
                              f"got {tuple(table.shape)}")


def check_k(k: int, available: int) -> None:
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= available:
        raise ProbeInputError(f"k must be between 1 and {available} (the other tokens), got {k!r}")


def check_finite(cosines: torch.Tensor, *tables: torch.Tensor) -> None:
    """A NaN/inf anywhere in a table turns up in the top-k (topk ranks NaN first), so checking the
    small result replaces a pass over the tables (isfinite would copy a whole table)."""
    if bool(torch.isfinite(cosines).all()):
        return
    raise_non_finite(*tables)


def raise_non_finite(*tables: torch.Tensor) -> None:
    bad = sum(int((~torch.isfinite(t.detach())).sum()) for t in {id(t): t for t in tables}.values())
    raise ProbeInputError(f"the embedding table holds {bad} NaN/inf values (a diverged run?): "
                          f"cosines are undefined")


def unit_rows(table: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Rows scaled to unit length (float32, or float64 if given): [n d] -> [n d]; zero rows stay 0."""
    table = table.detach()
    if table.dtype != torch.float64:
        table = table.float()
    return table / table.norm(dim=-1, keepdim=True).clamp_min(eps)


def unit_table(table: torch.Tensor) -> torch.Tensor:
    """unit_rows of a whole table, a slice at a time; a NaN/inf anywhere is a ProbeInputError
    (checked here because a bf16 first pass could otherwise rank a NaN row out of sight)."""
    dtype = torch.float64 if table.dtype == torch.float64 else torch.float32
    unit = torch.empty(table.shape, dtype=dtype, device=table.device)  # [n d]
    for start in range(0, table.shape[0], SLICE):
        unit[start:start + SLICE] = unit_rows(table[start:start + SLICE])
    if not bool(torch.isfinite(unit).all()):
        raise_non_finite(table)
    return unit


# ---------------------------------------------------------------- the plain chunked fp32 search

def prepare_keys(keys: torch.Tensor) -> torch.Tensor:
    """Unit key rows transposed and contiguous, padded with zero columns to a multiple of GROUP
    when the two-stage top-k applies: [n d] -> [d n_pad] (q @ this is ~2x faster than q @ k.T)."""
    n, d = keys.shape
    n_pad = math.ceil(n / GROUP) * GROUP if n >= 4 * GROUP else n
    dtype = torch.float64 if keys.dtype == torch.float64 else torch.float32
    keys_t = torch.zeros(d, n_pad, dtype=dtype, device=keys.device)
    for start in range(0, n, SLICE):  # normalised a slice at a time: no second full-size copy
        stop = min(start + SLICE, n)
        keys_t[:, start:stop] = unit_rows(keys[start:stop]).T
    return keys_t


def top_k_columns(sims: torch.Tensor, k: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top k of each row over the first n columns: [rows n_pad] -> values, ids [rows k].

    Padded columns must hold -inf. With GROUP-wide column groups it is exact and ~3x faster than
    one topk over the row: the k largest values all lie in the k groups with the largest maxima.
    """
    rows, n_pad = sims.shape
    if n_pad % GROUP or n_pad // GROUP <= k:
        return sims[:, :n].topk(k, dim=1)
    grouped = sims.view(rows, n_pad // GROUP, GROUP)  # [rows groups GROUP]
    best_groups = grouped.amax(-1).topk(k, dim=1).indices  # [rows k]
    cand = grouped.gather(1, best_groups.unsqueeze(-1).expand(rows, k, GROUP))  # [rows k GROUP]
    values, idx = cand.reshape(rows, k * GROUP).topk(k, dim=1)
    ids = best_groups.gather(1, idx // GROUP) * GROUP + idx % GROUP
    return values, ids


def search(queries: torch.Tensor, keys_t: torch.Tensor, n: int, k: int,
           exclude: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine top-k of unit query rows [q d] against prepared keys [d n_pad]; `exclude[i]` lists
    the key ids row i may not return. Returns cosines, ids [q k]."""
    sims = queries.to(keys_t.dtype) @ keys_t  # [q n_pad]
    sims[:, n:] = -math.inf
    rows = [i for i, ids in enumerate(exclude) for _ in ids]
    cols = [j for ids in exclude for j in ids]
    if rows:
        sims[rows, cols] = -math.inf
    return top_k_columns(sims, k, n)


def chunked_search(queries: torch.Tensor, keys: torch.Tensor, k: int, *, exclude_self: bool = True,
                   rows: torch.Tensor | None = None,
                   chunk_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Full fp32 (or float64) search of query rows (all, or the ids in `rows`) against every key,
    a chunk of rows at a time: cosines, ids [len(rows) k]. The reference `all_knn` equals, and its
    fallback for rows whose low-precision candidates overflow."""
    n_keys = keys.shape[0]
    rows = torch.arange(queries.shape[0]) if rows is None else rows.cpu()
    keys_t = prepare_keys(keys)  # [d n_pad]
    chunk = chunk_size or max(1, CHUNK_BYTES // (4 * keys_t.shape[1]))
    values, ids = [], []
    for start in range(0, len(rows), chunk):
        own = rows[start:start + chunk]
        q = unit_rows(queries[own.to(queries.device)])  # [chunk d]
        exclude = [[i] if exclude_self and i < n_keys else [] for i in own.tolist()]
        v, i = search(q, keys_t, n_keys, k, exclude)
        check_finite(v, queries, keys)
        values.append(v)
        ids.append(i)
    return torch.cat(values), torch.cat(ids)


# ---------------------------------------------------------------- tiles, bf16 first pass, rescoring

FIRST_PASSES = ("auto", "bf16", "fp32")
BF16_ROUNDOFF = 2.0 ** -8  # unit roundoff u of bfloat16: 8 significant bits, round to nearest
FP32_ROUNDOFF = 2.0 ** -24


def sum_error_factor(d: int) -> float:
    """g_d = d v / (1 - d v), v = 2^-24: a d-term fp32 sum errs by at most g_d times the sum of the
    terms' magnitudes (Higham, Accuracy and Stability of Numerical Algorithms, 3.1)."""
    if d * FP32_ROUNDOFF >= 0.5:
        raise ProbeInputError(f"rows of width {d} are too wide for an fp32 error bound")
    return d * FP32_ROUNDOFF / (1 - d * FP32_ROUNDOFF)


def bf16_rounding_norms(unit: torch.Tensor) -> torch.Tensor:
    """e_i >= ||q_i - bf16(q_i)|| for fp32 rows [n d] -> [n]: the difference is exact in fp32 (q'
    is q cut to fewer bits), its norm is computed with relative error < 2 g_d; 1e-3 covers it."""
    return (unit - unit.bfloat16().float()).norm(dim=1) * (1 + 1e-3)  # [n]


def bf16_additive_bound(e_q: torch.Tensor | float, e_k: torch.Tensor | float, d: int):
    """c >= |acc - q.k|: fp32 unit rows q, k of width d whose bf16 roundings q', k' differ from
    them by at most e_q, e_k in norm; acc is the fp32-accumulated sum of the d products of q', k'.

    The rows are unit up to r = 2 g_d + 2^-22 (norm and division rounding), so
    1. q'.k' - q.k = dq.k + q.dk + dq.dk is at most (1 + r)(e_q + e_k) + e_q e_k (Cauchy-Schwarz);
    2. the products q'_i k'_i are exact in fp32 and summing them (oneDNN accumulates in fp32)
       errs by at most g_d sum|q'_i k'_i| <= g_d ||q'|| ||k'|| <= g_d (1 + r + e_q)(1 + r + e_k).
    Rounding acc to the bf16 score s' adds at most u |acc| <= u/(1-u) |s'| (BF16_OUTPUT), kept
    apart because it shrinks with the score."""
    g = sum_error_factor(d)
    r = 2 * g + 2.0 ** -22
    return (1 + r) * (e_q + e_k) + e_q * e_k + g * (1 + r + e_q) * (1 + r + e_k)


BF16_OUTPUT = BF16_ROUNDOFF / (1 - BF16_ROUNDOFF)  # the output rounding, relative to the bf16 score


def bf16_cosine_error_bound(d: int) -> float:
    """Largest |cos_bf16 - cos_fp32| of any two fp32 unit rows of width d multiplied in bfloat16
    (with fp32 accumulation and a bf16 output), ~0.0118 at d = 768.

    Rounding a row to bf16 moves each element by at most u |q_i| (u = 2^-8), so the rows move by
    e <= u (1 + r) in norm; `bf16_additive_bound(e, e, d)` covers the rows' rounding and the sum
    (~2u), and the output rounding adds u |acc| <= u (1 + r + e)^2 (1 + g_d) (~u). `all_knn`
    uses the tighter per-row form: the actual rounding norms (typically ~u/2) and u |score|.
    """
    g = sum_error_factor(d)
    e = BF16_ROUNDOFF * (1 + 2 * g + 2.0 ** -22)
    return bf16_additive_bound(e, e, d) + BF16_ROUNDOFF * (1 + 2 * g + 2.0 ** -22 + e) ** 2 * (1 + g)


def use_bf16(first_pass: str, unit: torch.Tensor) -> bool:
    """Whether to take the bf16 first pass: "auto" only on CPUs where oneDNN multiplies bf16
    natively (elsewhere torch falls back to a scalar loop); never for float64 tables, nor on CUDA
    under "auto" (cuBLAS may reduce bf16 sums in bf16, outside the bound)."""
    if first_pass not in FIRST_PASSES:
        raise ProbeInputError(f"first_pass must be one of {', '.join(FIRST_PASSES)}, got {first_pass!r}")
    if unit.dtype == torch.float64:
        return False
    if first_pass == "auto":
        return unit.device.type == "cpu" and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return first_pass == "bf16"


def tiles(n: int, m: int, block: int, symmetric: bool) -> list[tuple[int, int]]:
    """(query start, key start) of every tile; against itself only those on or above the diagonal."""
    return [(i, j) for i in range(0, n, block) for j in range(i if symmetric else 0, m, block)]


def merge_rows(best_v: torch.Tensor, best_i: torch.Tensor, rows: torch.Tensor, v: torch.Tensor,
               ids: torch.Tensor) -> None:
    """Fold candidates v, ids [len(rows) w] (-inf pads) into the running top-keep of `rows`."""
    all_v = torch.cat([best_v[rows], v], 1)
    all_i = torch.cat([best_i[rows], ids], 1)
    top, pos = all_v.topk(best_v.shape[1], dim=1)
    best_v[rows] = top
    best_i[rows] = all_i.gather(1, pos)


def merge_entries(best_v: torch.Tensor, best_i: torch.Tensor, rows: torch.Tensor, keys: torch.Tensor,
                  values: torch.Tensor) -> None:
    """Fold scattered (row, key id, score) entries [N] in: padded into one [rows width] block."""
    urows, inv, counts = torch.unique(rows, return_inverse=True, return_counts=True)
    order = torch.argsort(inv, stable=True)
    slot = torch.arange(len(rows), device=rows.device) - (counts.cumsum(0) - counts)[inv[order]]
    pad_v = torch.full((len(urows), int(counts.max())), -math.inf, dtype=values.dtype, device=values.device)
    pad_i = torch.zeros(pad_v.shape, dtype=torch.long, device=values.device)
    pad_v[inv[order], slot] = values[order]
    pad_i[inv[order], slot] = keys[order]
    merge_rows(best_v, best_i, urows, pad_v, pad_i)


def fold_tile(best_v: torch.Tensor, best_i: torch.Tensor, sims: torch.Tensor, r0: int, c0: int,
              by_columns: bool = False) -> None:
    """Fold a tile [R C] (query rows r0.., key rows c0..) into its rows' running top-keep, or with
    `by_columns` into its columns' (the key rows c0.. of a table searched against itself).

    Only scores above a row's last kept one can enter, and once a row has filled its top-keep
    these are few: one comparison pass finds them (far cheaper than a topk over the tile)."""
    rows0, keys0 = (c0, r0) if by_columns else (r0, c0)
    n_rows = sims.shape[1] if by_columns else sims.shape[0]
    last = best_v[rows0:rows0 + n_rows, -1]  # [rows]
    if bool(torch.isinf(last).any()):  # rows not yet full (their first tile): plain topk
        view = sims.T if by_columns else sims  # [rows keys]
        v, i = view.topk(min(best_v.shape[1], view.shape[1]), dim=1)
        rows = torch.arange(rows0, rows0 + n_rows, device=sims.device)
        merge_rows(best_v, best_i, rows, v, i + keys0)
        return
    above = sims > (last[None, :] if by_columns else last[:, None])  # [R C]
    r, c = above.nonzero(as_tuple=True)
    if len(r) == 0:
        return
    rows, keys = (c, r) if by_columns else (r, c)
    merge_entries(best_v, best_i, rows + rows0, keys + keys0, sims[r, c])


def tile_search(tq: torch.Tensor, tk: torch.Tensor, keep: int, *, symmetric: bool, exclude_self: bool,
                block: int, progress: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Running top-keep scores and ids [n keep] of unit rows tq [n d] against tk [m d], tile by tile
    (scores in tq's precision, kept as float32, or float64 for float64 rows)."""
    n, m = tq.shape[0], tk.shape[0]
    dtype = torch.float64 if tq.dtype == torch.float64 else torch.float32
    best_v = torch.full((n, keep), -math.inf, dtype=dtype, device=tq.device)  # [n keep]
    best_i = torch.zeros((n, keep), dtype=torch.long, device=tq.device)
    todo: Iterable[tuple[int, int]] = tiles(n, m, block, symmetric)
    if progress:
        from tqdm.auto import tqdm
        todo = tqdm(todo, desc="neighbours", unit="tile", file=sys.stderr)
    for i0, j0 in todo:
        sims = (tq[i0:i0 + block] @ tk[j0:j0 + block].T).to(dtype)  # [rows cols]
        lo, hi = max(i0, j0), min(i0 + sims.shape[0], j0 + sims.shape[1])
        if exclude_self and lo < hi:  # ids present as both a query row and a key row here
            own = torch.arange(lo, hi, device=sims.device)
            sims[own - i0, own - j0] = -math.inf
        fold_tile(best_v, best_i, sims, i0, j0)
        if symmetric and j0 != i0:  # the same tile, read by its key rows
            fold_tile(best_v, best_i, sims, i0, j0, by_columns=True)
    return best_v, best_i


def rescore(uq: torch.Tensor, uk: torch.Tensor, best_v: torch.Tensor, best_i: torch.Tensor, k: int,
            slack: torch.Tensor, exclude_self: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact top k among each row's kept keys that may beat its k-th best bf16 score t: with
    |s' - s| <= c + w |s'| (c = slack [n], w = BF16_OUTPUT), key j is a candidate when
    s'_j + w |s'_j| >= t - w |t| - 2c (its highest possible cosine reaches the k-th's lowest).
    Returns cosines, ids [n k], and the ids of rows whose candidates may not all have been kept."""
    n, keep = best_v.shape
    m = uk.shape[0]
    kth = best_v[:, k - 1:k]  # [n 1]
    floor = kth - BF16_OUTPUT * kth.abs() - 2 * slack[:, None]  # [n 1]
    is_cand = best_v + BF16_OUTPUT * best_v.abs() >= floor  # [n keep]
    available = m - (exclude_self & (torch.arange(n, device=uq.device) < m)).long()
    overflow = is_cand[:, -1] & (keep < available)  # the last kept one qualifies: more may exist
    values = torch.empty(n, k, dtype=uq.dtype, device=uq.device)
    ids = torch.empty(n, k, dtype=torch.long, device=uq.device)
    for r0 in range(0, n, RESCORE_ROWS):
        cand = best_i[r0:r0 + RESCORE_ROWS]  # [rows keep]
        exact = torch.bmm(uk[cand], uq[r0:r0 + RESCORE_ROWS].unsqueeze(2)).squeeze(2)  # [rows keep]
        exact.masked_fill_(~is_cand[r0:r0 + RESCORE_ROWS], -math.inf)
        v, pos = exact.topk(k, dim=1)
        values[r0:r0 + RESCORE_ROWS], ids[r0:r0 + RESCORE_ROWS] = v, cand.gather(1, pos)
    return values, ids, overflow.nonzero().squeeze(1)


def all_knn(queries: torch.Tensor, keys: torch.Tensor | None = None, k: int = 10, *,
            exclude_self: bool = True, block: int | None = None, first_pass: str = "auto",
            progress: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Every query row's top-k keys by cosine: [n d], [m d] -> cosines, ids [n k], best first.

    `keys=None` (or the same tensor) searches the table against itself, using the symmetry.
    `exclude_self` drops key id i from row i. `block`: tile side in rows (default BLOCK); the
    tiles, not the table, set the working memory. `first_pass`: "auto" | "bf16" | "fp32" (above).
    """
    symmetric = keys is None or keys is queries
    keys = queries if keys is None else keys
    check_table(queries, "query")
    check_table(keys, "key")
    if queries.shape[1] != keys.shape[1]:
        raise ProbeInputError(f"query rows have width {queries.shape[1]} but key rows {keys.shape[1]}")
    m = keys.shape[0]
    check_k(k, m - (1 if exclude_self else 0))
    block = BLOCK if block is None else block
    if not isinstance(block, int) or block < 1:
        raise ProbeInputError(f"the block (chunk) size must be a positive int, got {block!r}")
    uq = unit_table(queries)  # [n d]
    uk = uq if symmetric else unit_table(keys)  # [m d]
    if not use_bf16(first_pass, uq):
        best_v, best_i = tile_search(uq, uk, k, symmetric=symmetric, exclude_self=exclude_self,
                                     block=block, progress=progress)
        return best_v, best_i
    keep = min(k + EXTRA_CANDIDATES, m - (1 if exclude_self else 0))
    lq = uq.bfloat16()
    best_v, best_i = tile_search(lq, lq if symmetric else uk.bfloat16(), keep, symmetric=symmetric,
                                 exclude_self=exclude_self, block=block, progress=progress)
    del lq
    e_k = bf16_rounding_norms(uk).max()
    slack = bf16_additive_bound(bf16_rounding_norms(uq), e_k, uq.shape[1])  # [n]
    values, ids, overflow = rescore(uq, uk, best_v, best_i, k, slack, exclude_self)
    if len(overflow):
        values[overflow], ids[overflow] = chunked_search(queries, keys, k, exclude_self=exclude_self,
                                                         rows=overflow)
    return values, ids
