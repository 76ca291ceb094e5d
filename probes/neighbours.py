"""Embedding nearest neighbours by cosine similarity, one token or the whole vocabulary.

    from probes import neighbours
    neighbours.run(model, " the", k=10, table="input", tokenizer=tok).to_dict()
    neighbours.run(model, analogy=("king", "man", "woman"), tokenizer=tok)   # a - b + c
    neighbours.run_all(model, k=10, table="output")                         # every token

Tables (DESIGN.md, "Probes"): `input` is the input embedding, one row per token [d_vocab d_model];
`output` is the unembedding, one column of W_U per token (W_U.T, [d_vocab d_model]); `cross`
takes the query from the input table and searches the output table: "which tokens' output
vectors point where this token's input vector points" (the blog feed's C++ -> Python tables are
two different embedding tables searched the same way; `all_neighbours` takes any two tables).
The query's own id is always excluded, in `cross` too (there `self_cosine` reports the cosine
between the token's own input and output vectors instead). Analogies exclude a, b and c.

Cosine is the dot product of unit rows; a zero row has cosine 0 with everything. The
all-vocabulary mode (`probes.knn`) never builds the [n n] matrix: it multiplies panels of rows
with the whole key table, only the upper triangle when a table is searched against itself, and
keeps a running top k per row; the result is exact.
"""

from __future__ import annotations

if __name__ == "__main__":  # Ctrl-C/SIGTERM: one line from here on; --help and bad arguments
    from models.interrupts import quiet_signals  # answered before torch is imported (~4 s)
    quiet_signals()
    from probes.args import neighbours_parser
    neighbours_parser().parse_early()

import logging
import math
import sys
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Sequence

import torch

from models.anatomy import AnatomyError, find_anatomy
from models.tokenizers import token_piece
from probes.args import NEIGHBOUR_TABLES
from probes.args import neighbours_parser as build_parser
from probes.cli import run_probe
from probes.common import ProbeInputError, model_tokenizer, to_jsonable
from probes.knn import all_knn, check_finite, check_k, check_table, prepare_keys, search, unit_rows

log = logging.getLogger(__name__)

TABLES = NEIGHBOUR_TABLES  # input | output | cross, named once in the torch-free parser module
TABLE_NAMES = {"input": "input embedding", "output": "unembedding",
               "cross": "input embedding against the unembedding"}


def all_neighbours(queries: torch.Tensor, keys: torch.Tensor | None = None, k: int = 10, *,
                   exclude_self: bool = True, chunk_size: int | None = None,
                   progress: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Every query row's top-k keys by cosine: [n d], [m d] -> cosines, ids [n k] (exact; see
    `probes.knn.all_knn`). `keys=None` or the same tensor searches a table against itself and
    multiplies each pair once. `chunk_size`: query rows per panel of similarities (default: as
    many as fit in 128 MiB)."""
    return all_knn(queries, keys, k, exclude_self=exclude_self, chunk_size=chunk_size, progress=progress)


def analogy_vector(table: torch.Tensor, a: int, b: int, c: int) -> torch.Tensor:
    """unit(a) - unit(b) + unit(c) from a [n d] table: [d] (rows normalised first, as word2vec)."""
    unit = unit_rows(table[[a, b, c]])  # [3 d]
    return unit[0] - unit[1] + unit[2]


# ---------------------------------------------------------------- model tables and tokens

def chance_cosine(n_keys: int, d: int, level: float = 0.95) -> float:
    """The cosine that the nearest of `n_keys` random directions in `d` dimensions stays below with
    probability `level`: random directions have cosines of about N(0, 1/d), so the largest of n is
    below x with probability Phi(x sqrt(d)) ** n. A nearest neighbour below it is no closer than
    chance (the normal approximation slightly overstates the tail: the level is conservative)."""
    if n_keys < 1 or d < 1 or not 0.0 < level < 1.0:
        raise ProbeInputError(f"chance_cosine needs n_keys >= 1, d >= 1 and 0 < level < 1, got "
                              f"{n_keys}, {d}, {level}")
    return NormalDist().inv_cdf(level ** (1.0 / n_keys)) / math.sqrt(d)


def input_table(model: Any) -> torch.Tensor:
    """The input embedding [d_vocab d]: ours (`embedding.weight`), a TransformerLens `W_E`, or the
    token table of a layout `models.anatomy` knows (nanochat's `transformer.wte`, cut to its vocabulary)."""
    embedding = getattr(model, "embedding", None)
    if isinstance(embedding, torch.nn.Embedding):
        return embedding.weight.detach()
    if getattr(model, "W_E", None) is not None:
        return model.W_E.detach()
    try:
        return find_anatomy(model).input_table()
    except AnatomyError as err:
        raise ProbeInputError(f"no input embedding table: {err}") from None


def output_table(model: Any) -> torch.Tensor:
    """The unembedding as one row per token: W_U.T [d_vocab d_model]."""
    if getattr(getattr(model, "cfg", None), "family", None) == "mlp":
        raise ProbeInputError("an MLP-family model has no output embedding table (its MLP maps the "
                              "concatenated context straight to the vocabulary): use --table input")
    try:
        W_U = model.W_U  # [d_model d_vocab]
    except (AttributeError, ValueError) as err:
        try:  # nanochat's untied lm_head, a tutorial's out_head: [d_vocab d_model] already
            return find_anatomy(model).output_table()
        except AnatomyError:
            raise ProbeInputError(f"{type(model).__name__} has no unembedding matrix ({err}): "
                                  f"use --table input") from None
    return W_U.detach().T


def tables_for(model: Any, table: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(query table, key table) for input | output | cross."""
    if table not in TABLES:
        raise ProbeInputError(f"table must be one of {', '.join(TABLES)}, got {table!r}")
    if table == "input":
        t = input_table(model)
        return t, t
    if table == "output":
        t = output_table(model)
        return t, t
    return input_table(model), output_table(model)


def resolve_token(token: int | str, tokenizer: Any, d_vocab: int) -> int:
    """An id from an int id or a str piece (which needs a tokenizer); ProbeInputError otherwise."""
    if isinstance(token, bool) or not isinstance(token, (int, str)):
        raise ProbeInputError(f"a token is an int id or a str piece, got {token!r}")
    if isinstance(token, int):
        if not 0 <= token < d_vocab:
            raise ProbeInputError(f"token id {token} is outside the vocabulary [0, {d_vocab})")
        return token
    if token == "":
        raise ProbeInputError("the token piece is empty")
    if tokenizer is None:
        raise ProbeInputError(f"no tokenizer to look up the piece {token!r}: give an id (--id)")
    if hasattr(tokenizer, "piece_to_id"):
        try:
            i = tokenizer.piece_to_id(token)
        except ValueError as err:  # our UnknownTokenError names the piece
            raise ProbeInputError(str(err).splitlines()[0]) from None
    else:
        vocab = tokenizer.get_vocab()
        if token not in vocab:
            raise ProbeInputError(f"piece {token!r} is not in the vocabulary")
        i = vocab[token]
    return resolve_token(int(i), None, d_vocab)


# ---------------------------------------------------------------- runners

@dataclass
class NeighboursResult:
    """The top-k neighbours of one query (a token or an analogy a - b + c)."""

    table: str
    query: dict[str, Any]  # {"id", "piece"} or {"analogy": [{id, piece} x 3]}
    neighbours: list[dict[str, Any]]  # [{id, piece, cosine}], best first
    self_cosine: float | None = None  # cross table: cosine of the token's own input and output

    def to_dict(self) -> dict[str, Any]:
        out = {"table": self.table, "query": self.query, "neighbours": self.neighbours}
        if self.self_cosine is not None:
            out["self_cosine"] = self.self_cosine
        return to_jsonable(out)

    def format(self) -> str:
        q = self.query
        what = (" - ".join(show(t) for t in q["analogy"][:2]) + " + " + show(q["analogy"][2])
                if "analogy" in q else show(q))
        lines = [f"nearest neighbours of {what} in the {TABLE_NAMES[self.table]} "
                 f"(cosine; {'a, b, c' if 'analogy' in q else 'itself'} excluded)"]
        if self.self_cosine is not None:
            lines.append(f"its own input . output cosine: {self.self_cosine:.4f}")
        lines += [f"{r:>4}  {show(n):<24} {n['cosine']:8.4f}" for r, n in enumerate(self.neighbours, 1)]
        return "\n".join(lines)


def show(entry: dict[str, Any]) -> str:
    """`' the' (id 17)`, or `#17` without a tokenizer."""
    return f"{entry['piece']!r} (id {entry['id']})" if entry.get("piece") is not None else f"#{entry['id']}"


def entry(tokenizer: Any, i: int, cosine: float | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"id": int(i), "piece": token_piece(tokenizer, int(i))}
    if cosine is not None:
        out["cosine"] = float(cosine)
    return out


def run(model: Any, token: int | str | None = None, *, k: int = 10, table: str = "input",
        tokenizer: Any = None, analogy: Sequence[int | str] | None = None) -> NeighboursResult:
    """Top-k cosine neighbours of `token` (id or piece), or of `a - b + c` for analogy=(a, b, c);
    pieces are looked up with `tokenizer` (default `model.tokenizer`)."""
    tokenizer = model_tokenizer(model, tokenizer)
    queries, keys = tables_for(model, table)
    check_table(queries, "query")
    check_table(keys, "key")
    if (token is None) == (analogy is None):
        raise ProbeInputError("give either a token or an analogy (a, b, c)")
    d_vocab = queries.shape[0]
    if analogy is not None:
        if len(analogy) != 3:
            raise ProbeInputError(f"an analogy is three tokens a - b + c, got {len(analogy)}")
        ids = [resolve_token(t, tokenizer, d_vocab) for t in analogy]
        vector, exclude = analogy_vector(queries, *ids), sorted(set(ids))
        query: dict[str, Any] = {"analogy": [entry(tokenizer, i) for i in ids]}
    else:
        tid = resolve_token(token, tokenizer, d_vocab)
        vector, exclude, query = unit_rows(queries[tid]), [tid], entry(tokenizer, tid)
    exclude = [i for i in exclude if i < keys.shape[0]]
    check_k(k, keys.shape[0] - len(exclude))
    values, ids = search(unit_rows(vector[None]), prepare_keys(keys), keys.shape[0], k, [exclude])
    check_finite(values, queries, keys)
    found = [entry(tokenizer, i, v) for v, i in zip(values[0].tolist(), ids[0].tolist())]
    self_cos = None
    if table == "cross" and analogy is None and query["id"] < keys.shape[0]:
        self_cos = float(unit_rows(queries[query["id"]]) @ unit_rows(keys[query["id"]]))
    return NeighboursResult(table, query, found, self_cos)


@dataclass
class AllNeighboursResult:
    """Every token's top-k neighbours: ids and cosines [d_vocab k]."""

    table: str
    ids: torch.Tensor  # [n k]
    cosines: torch.Tensor  # [n k]
    tokenizer: Any = None

    def rows(self) -> list[dict[str, Any]]:
        return [{**entry(self.tokenizer, q),
                 "neighbours": [entry(self.tokenizer, i, c) for i, c in zip(ids, cos)]}
                for q, (ids, cos) in enumerate(zip(self.ids.tolist(), self.cosines.tolist()))]

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable({"table": self.table, "k": int(self.ids.shape[1]), "tokens": self.rows()})

    def format(self) -> str:
        lines = [f"nearest neighbours of every token in the {TABLE_NAMES[self.table]} "
                 f"(cosine, self excluded)"]
        for row in self.rows():
            lines.append(f"{show(row):<24} -> " + ", ".join(f"{show(n)} {n['cosine']:.3f}"
                                                            for n in row["neighbours"]))
        return "\n".join(lines)


def run_all(model: Any, *, k: int = 10, table: str = "input", tokenizer: Any = None,
            chunk_size: int | None = None, progress: bool = False) -> AllNeighboursResult:
    """Every token's top-k neighbours in the chosen table (chunked; see `all_neighbours`)."""
    tokenizer = model_tokenizer(model, tokenizer)
    queries, keys = tables_for(model, table)
    values, ids = all_neighbours(queries, keys, k, chunk_size=chunk_size, progress=progress)
    return AllNeighboursResult(table, ids.cpu(), values.cpu(), tokenizer)


# ---------------------------------------------------------------- CLI

def main(argv: list[str] | None = None) -> int:
    return run_probe(build_parser, argv, from_args)


def from_args(args: Any) -> Any:
    from models.checkpoint import load_from_args
    snap = load_from_args(args)  # --chunk-size >= 1 and the like: checked by the parser
    if args.all:
        return run_all(snap.model, k=args.k, table=args.table, tokenizer=snap.tokenizer,
                       chunk_size=args.chunk_size, progress=sys.stderr.isatty())
    token = args.token if args.token is not None else args.id
    analogy = args.analogy or args.analogy_ids
    return run(snap.model, token, k=args.k, table=args.table, tokenizer=snap.tokenizer, analogy=analogy)


if __name__ == "__main__":
    from models.cli import exit_entry
    exit_entry(main())
