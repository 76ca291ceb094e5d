"""What a snapshot's model pages show first, kept beside it so that the app draws it before any model
loads; torch-free (numpy).

Each model page opens on one view: the sidebar's first text (`PAGE_TEXT`, cut to the model's
context; a snapshot of any model opened without its code: row 0 of the sample it saved), the
Embeddings page's first token and neighbour count (`PAGE_TOKEN`, `PAGE_K`) and the Logit lens page's
top-k (`LENS_K`). The probes compute that view when the snapshot is saved (`probes.page_view`: the
same calls the app makes, so the numbers are the probes' own), and it is kept in
`first_view.safetensors` (`models.store.view_file`). Parts, each the dict the app's page draws:

- ``attention``: verdicts and evidence per head (`probes.degenerate`), ``head_types``: head-type
  scores and the induction score on random repeats (`probes.heads`);
- ``lens``: the logit lens at `LENS_K` (`probes.logit_lens`);
- ``nearest/TABLE``, ``baseline/TABLE`` (input, output, cross) and ``map/TABLE`` (input, output): the
  neighbours of `PAGE_TOKEN`, the table against its shuffled copies at `PAGE_K`
  (`probes.neighbours`, `probes.neighbour_baseline`), the table's 2-D projection (`probes.projection`).

`pack(parts)` turns the parts into numpy arrays and a JSON skeleton; `unpack` gives them back
equal: every rectangular list of numbers goes, flat, into one array per dtype, in the smallest
dtype that holds it exactly (None kept by a mask), and the rest stays JSON. The token pieces of
the lens's top-k and of a map are not kept: `unpack` reads them from the tokenizer, as the probes do.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from models.tokenizers import token_piece

__all__ = ["LENS_K", "PAGE_K", "PAGE_TEXT", "PAGE_TOKEN", "TABLES", "pack", "page_ids", "unpack"]

PAGE_TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun."
PAGE_TOKEN = "e"  # the Embeddings page's first token
PAGE_K = 10  # ... and its neighbours
LENS_K = 5  # the Logit lens page's top tokens per cell
TABLES = ("input", "output", "cross")


def page_ids(tokenizer: Any, n_ctx: int, text: str) -> list[int]:
    """The ids a page reads for `text`: its first context window (the app shows one)."""
    return tokenizer.encode(text)[:n_ctx]


# --------------------------------------------------------------------------- grids of numbers


def _shape(value: Any) -> tuple[int, ...] | None:
    """The shape of a rectangular nested list of numbers (None allowed), () for one number, else None."""
    if isinstance(value, list):
        inner = {_shape(v) for v in value}
        if not value or len(inner) != 1 or None in inner:
            return None
        return (len(value), *inner.pop())
    return () if value is None or isinstance(value, (bool, int, float)) else None


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


def _exact_int(values: np.ndarray) -> np.ndarray | None:
    """`values` in the smallest integer dtype that holds them exactly, or None."""
    if values.dtype.kind == "f" and not (np.isfinite(values).all() and (values == np.round(values)).all()):
        return None
    for dtype in (np.int8, np.int16, np.int32, np.int64):
        info = np.iinfo(dtype)
        if not len(values) or (info.min <= values.min() and values.max() <= info.max):
            return values.astype(dtype)
    return None


def grid_arrays(value: list) -> tuple[str, np.ndarray, np.ndarray | None] | None:
    """(kind, values, none mask or None) of a rectangular list of numbers, flat, in the smallest dtype
    that holds them exactly (float values that are whole numbers as integers); None for anything else."""
    if not _shape(value):
        return None
    leaves = list(_leaves(value))
    none = np.array([v is None for v in leaves])
    known = [v for v in leaves if v is not None]
    filled = [0 if v is None else v for v in leaves]
    if all(isinstance(v, bool) for v in known):
        kind, values = "bool", np.array(filled, dtype=np.uint8)
    elif all(isinstance(v, int) and not isinstance(v, bool) for v in known):
        kind, values = "int", _exact_int(np.array(filled, dtype=np.int64))
    else:
        kind, wide = "float", np.array(filled, dtype=np.float64)
        narrow = wide.astype(np.float32)
        values = _exact_int(wide)
        if values is None:
            values = narrow if np.array_equal(narrow.astype(np.float64), wide, equal_nan=True) else wide
    return kind, values, none.astype(np.uint8) if none.any() else None


def grid_list(kind: str, values: np.ndarray, shape: list[int], mask: np.ndarray | None) -> list:
    """What `grid_arrays` was given: [shape] nested lists of Python bools, ints or floats, None where masked."""
    plain = values.astype(bool) if kind == "bool" else values.astype(np.float64) if kind == "float" else values
    out = plain.astype(object)
    if mask is not None:
        out[mask.astype(bool)] = None
    return out.reshape(shape).tolist()


# --------------------------------------------------------------------------- parts


class Pools:
    """The grids of numbers, one flat array per dtype; a grid is named by {"@": [dtype, start, shape,
    kind, start of its None mask in the uint8 pool or -1]}."""

    def __init__(self) -> None:
        self.parts: dict[str, list[np.ndarray]] = {}
        self.sizes: dict[str, int] = {}

    def add(self, values: np.ndarray) -> tuple[str, int]:
        name = values.dtype.name
        start = self.sizes.get(name, 0)
        self.parts.setdefault(name, []).append(values)
        self.sizes[name] = start + values.size
        return name, start

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: np.concatenate(chunks) for name, chunks in self.parts.items()}


def pack(parts: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(arrays, skeleton): the parts' numbers in a few flat arrays (one per dtype) and JSON naming them."""
    pools = Pools()

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            assert "@" not in value, "a part's dict has a key '@'"
            return {str(k): walk(v) for k, v in value.items()}
        found = grid_arrays(value) if isinstance(value, list) else None
        if found is not None:
            kind, values, mask = found
            name, start = pools.add(values)
            return {"@": [name, start, list(_shape(value)), kind, -1 if mask is None else pools.add(mask)[1]]}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    skeleton = {name: walk(_packed(name, part)) for name, part in parts.items()}
    return pools.arrays(), skeleton


def unpack(arrays: dict[str, np.ndarray], skeleton: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    """The parts `pack` was given (token pieces it left out read from `tokenizer`, as the probes read them)."""
    def walk(node: Any) -> Any:
        if isinstance(node, dict) and "@" in node:
            name, start, shape, kind, mask_at = node["@"]
            size = int(np.prod(shape))
            mask = None if mask_at < 0 else arrays["uint8"][mask_at:mask_at + size]
            return grid_list(kind, arrays[name][start:start + size], shape, mask)
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return {name: _unpacked(name, walk(node), tokenizer) for name, node in skeleton.items()}


def _packed(name: str, part: dict[str, Any]) -> dict[str, Any]:
    """A part without what the tokenizer gives back: a map's pieces; the lens's top-k
    [layer][row][pos] -> [{id, piece, prob}] ([] where the layer is not finite) as ids and
    probabilities [layer row pos k], None where a cell is empty."""
    if name.startswith("map/"):
        return {key: value for key, value in part.items() if key != "pieces"}
    if name != "lens":
        return part
    k = max((len(cell) for layer in part["top_k"] for row in layer for cell in row), default=0)

    def column(key: str) -> list:
        return [[[[e[key] for e in cell] + [None] * (k - len(cell)) for cell in row] for row in layer]
                for layer in part["top_k"]]
    return {**part, "top_k": {"ids": column("id"), "probs": column("prob")}}


def _unpacked(name: str, part: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    if name.startswith("map/"):
        return {**part, "pieces": [token_piece(tokenizer, i) or str(i) for i in range(len(part["x"]))]}
    if name != "lens":
        return part
    top = part["top_k"]
    cells = [[[[{"id": i, "piece": token_piece(tokenizer, i), "prob": p} for i, p in zip(ids, probs) if i is not None]
               for ids, probs in zip(id_row, prob_row)] for id_row, prob_row in zip(id_layer, prob_layer)]
             for id_layer, prob_layer in zip(top["ids"], top["probs"])]
    return {**part, "top_k": cells}
