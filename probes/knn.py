"""Exact cosine top-k of every row of a table, against itself or a second table (pure tensors).

    values, ids = knn.all_knn(table, k=10)            # every row against the same table, self excluded
    values, ids = knn.all_knn(inputs, outputs, k=10)  # every input row against the output table

The search never builds the [n m] matrix. It multiplies a panel of unit query rows with the
prepared key table and keeps a running top-k per row:
- against itself (`keys` None or the same tensor) a panel of rows i0.. covers only keys i0..
  (the upper triangle): its rows take their top-k from it, and its later columns, read as rows,
  feed those rows' top-k (only scores above a row's current k-th best are merged), which halves
  the matrix products;
- with `first_pass="bf16"` the panels are bfloat16 products. Each row keeps its best `k +
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
CHUNK_BYTES = 128 << 20  # similarities per panel (or chunk) of query rows by default: 128 MiB
SLICE = 2048  # rows per slice when normalising a table (small temporaries)
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


# ---------------------------------------------------------------- panels, bf16 first pass, rescoring

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


def merge_rows(best_v: torch.Tensor, best_i: torch.Tensor, rows: slice | torch.Tensor, v: torch.Tensor,
               ids: torch.Tensor) -> None:
    """Fold candidates v, ids [rows w] (-inf pads) into the running top-keep of `rows` in place."""
    all_v = torch.cat([best_v[rows], v], 1)
    all_i = torch.cat([best_i[rows], ids], 1)
    top, pos = all_v.topk(best_v.shape[1], dim=1)
    best_v[rows] = top
    best_i[rows] = all_i.gather(1, pos)


def merge_entries(best_v: torch.Tensor, best_i: torch.Tensor, rows: torch.Tensor, keys: torch.Tensor,
                  values: torch.Tensor) -> None:
    """Fold scattered (row, key id, score) entries [N] in: grouped by row (one sort) into a
    [distinct rows width] block padded with -inf."""
    rows, order = torch.sort(rows, stable=True)
    urows, counts = torch.unique_consecutive(rows, return_counts=True)
    group = torch.repeat_interleave(torch.arange(len(urows), device=rows.device), counts)  # [N]
    slot = torch.arange(len(rows), device=rows.device) - (counts.cumsum(0) - counts)[group]
    pad_v = torch.full((len(urows), int(counts.max())), -math.inf, dtype=values.dtype, device=values.device)
    pad_i = torch.zeros(pad_v.shape, dtype=torch.long, device=values.device)
    pad_v[group, slot] = values[order]
    pad_i[group, slot] = keys[order]
    merge_rows(best_v, best_i, urows, pad_v, pad_i)


def fold_columns(best_v: torch.Tensor, best_i: torch.Tensor, part: torch.Tensor, j0: int, q0: int) -> None:
    """Fold a panel's columns [R W] into the running top-keep of rows j0.. (their keys: q0..).

    Only scores above a row's last kept one can enter; once the row is full these are few, so one
    comparison pass finds them, far cheaper than a topk down every column."""
    last = best_v[j0:j0 + part.shape[1], -1]  # [W]
    if bool(torch.isinf(last).any()):  # rows not yet full (the first panel): plain topk, in
        for s in range(0, part.shape[1], SLICE):  # slices: topk copies a transposed view
            v, i = part[:, s:s + SLICE].T.topk(min(best_v.shape[1], part.shape[0]), dim=1)  # [SLICE <=keep]
            merge_rows(best_v, best_i, slice(j0 + s, j0 + s + v.shape[0]), v, i + q0)
        return
    r, c = (part > last).nonzero(as_tuple=True)
    if len(r):
        merge_entries(best_v, best_i, c + j0, r + q0, part[r, c])


def panel_search(queries: torch.Tensor, keys_t: torch.Tensor, n_keys: int, keep: int, *, symmetric: bool,
                 exclude_self: bool, chunk: int, progress: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Running top-keep scores and ids [n keep] of every query row against prepared keys [d m_pad]
    (fp32, float64 or bf16: the product's precision), a panel of `chunk` rows at a time.

    Against itself a panel covers only keys from its first row on: its rows take their top-keep
    from it (earlier keys came in as columns of earlier panels), and its later columns go to
    those key rows, so each pair is multiplied once."""
    n = queries.shape[0]
    dtype = torch.float64 if keys_t.dtype == torch.float64 else torch.float32
    best_v = torch.full((n, keep), -math.inf, dtype=dtype, device=keys_t.device)  # [n keep]
    best_i = torch.zeros((n, keep), dtype=torch.long, device=keys_t.device)
    starts: Iterable[int] = range(0, n, chunk)
    if progress:
        from tqdm.auto import tqdm
        starts = tqdm(starts, desc="neighbours", unit="chunk", file=sys.stderr)
    for i0 in starts:
        q = unit_rows(queries[i0:i0 + chunk])  # [R d]
        if not symmetric and not bool(torch.isfinite(q).all()):  # (a table against itself: checked
            raise_non_finite(queries)  # as keys already)
        rows, c0 = q.shape[0], (i0 if symmetric else 0)
        sims = (q.to(keys_t.dtype) @ keys_t[:, c0:]).to(dtype)  # [R m_pad - c0]
        sims[:, n_keys - c0:] = -math.inf
        if exclude_self and i0 < n_keys:  # rows past the key table have no self to drop
            own = torch.arange(i0, min(i0 + rows, n_keys), device=sims.device)
            sims[own - i0, own - c0] = -math.inf
        v, i = top_k_columns(sims, min(keep, n_keys - c0), n_keys - c0)
        merge_rows(best_v, best_i, slice(i0, i0 + rows), v, i + c0)
        if symmetric and i0 + rows < n_keys:
            fold_columns(best_v, best_i, sims[:, rows:n_keys - c0], i0 + rows, i0)
        del sims  # before the next panel is allocated: one panel alive at a time
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
            exclude_self: bool = True, chunk_size: int | None = None, first_pass: str = "auto",
            progress: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Every query row's top-k keys by cosine: [n d], [m d] -> cosines, ids [n k], best first.

    `keys=None` (or the same tensor) searches the table against itself, using the symmetry.
    `exclude_self` drops key id i from row i. `chunk_size`: query rows per panel (default: as many
    as fit in CHUNK_BYTES of similarities, a multiple of GROUP). `first_pass`: "auto" | "bf16" |
    "fp32" (module docstring).
    """
    symmetric = keys is None or keys is queries
    keys = queries if keys is None else keys
    check_table(queries, "query")
    check_table(keys, "key")
    if queries.shape[1] != keys.shape[1]:
        raise ProbeInputError(f"query rows have width {queries.shape[1]} but key rows {keys.shape[1]}")
    m = keys.shape[0]
    check_k(k, m - (1 if exclude_self else 0))
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise ProbeInputError(f"chunk_size must be a positive int, got {chunk_size!r}")
    lowp = use_bf16(first_pass, queries)
    keys_t = prepare_keys(keys)  # [d m_pad]
    if not bool(torch.isfinite(keys_t).all()):  # NaN/inf rows would rank first, or out of sight in bf16
        raise_non_finite(keys)
    chunk = chunk_size or max(GROUP, CHUNK_BYTES // (4 * keys_t.shape[1]) // GROUP * GROUP)
    search_args = dict(symmetric=symmetric, exclude_self=exclude_self, chunk=chunk, progress=progress)
    if not lowp:
        return panel_search(queries, keys_t, m, k, **search_args)
    keys_t = keys_t.bfloat16()
    keep = min(k + EXTRA_CANDIDATES, m - (1 if exclude_self else 0))
    best_v, best_i = panel_search(queries, keys_t, m, keep, **search_args)
    del keys_t
    uq = unit_table(queries)  # [n d]
    uk = uq if symmetric else unit_table(keys)  # [m d]
    slack = bf16_additive_bound(bf16_rounding_norms(uq), bf16_rounding_norms(uk).max(), uq.shape[1])  # [n]
    values, ids, overflow = rescore(uq, uk, best_v, best_i, k, slack, exclude_self)
    if len(overflow):
        values[overflow], ids[overflow] = chunked_search(queries, keys, k, exclude_self=exclude_self,
                                                         rows=overflow)
    return values, ids
