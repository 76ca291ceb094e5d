"""Where a scatter map's text labels go so that none overlaps another or crosses the plot's edge.

Pure layout, no Streamlit: points are placed on a plot of known pixel size (the embedding map
is drawn at that size), each label tried right of its point, then left, and kept only where its
box is free and inside the plot. Labels are tried in priority order (the chosen token, its
neighbours, then the rest), so the ones that matter are always drawn.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Sequence

CHAR_PX = 7.5  # a conservative width of one 11 px character (the map's font size)
LINE_PX = 14.0
GAP_PX = 6.0  # between a point and its label
CELL = 48.0  # spatial index cell


def padded_domain(values: Sequence[float], margin: float = 0.06) -> tuple[float, float]:
    """The axis range the map draws: the data's range with a margin on both sides."""
    lo, hi = min(values), max(values)
    span = hi - lo or 1.0
    return lo - margin * span, hi + margin * span


def to_pixels(values: Sequence[float], domain: tuple[float, float], size: float) -> list[float]:
    lo, hi = domain
    return [(v - lo) / (hi - lo) * size for v in values]


def place(xs: Sequence[float], ys: Sequence[float], texts: Sequence[str], order: Sequence[int],
          width: float, height: float) -> list[str | None]:
    """Per point "right", "left" or None (not labelled): labels tried in `order` (point indices,
    most important first) on a `width` x `height` plot whose x/y domains are `padded_domain`."""
    px = to_pixels(xs, padded_domain(xs), width)
    py = to_pixels(ys, padded_domain(ys), height)
    side: list[str | None] = [None] * len(xs)
    index: dict[tuple[int, int], list[tuple[float, float, float, float]]] = defaultdict(list)
    for i in order:
        w = CHAR_PX * max(1, len(texts[i]))
        for where, x0 in (("right", px[i] + GAP_PX), ("left", px[i] - GAP_PX - w)):
            box = (x0, py[i] - LINE_PX / 2, x0 + w, py[i] + LINE_PX / 2)
            if inside(box, width, height) and free(box, index):
                side[i] = where
                for cell in cells(box):
                    index[cell].append(box)
                break
    return side


def inside(box: tuple[float, float, float, float], width: float, height: float) -> bool:
    x0, y0, x1, y1 = box
    return x0 >= 0 and y0 >= 0 and x1 <= width and y1 <= height


def overlap(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def cells(box: tuple[float, float, float, float]) -> list[tuple[int, int]]:
    x0, y0, x1, y1 = (math.floor(v / CELL) for v in box)
    return [(cx, cy) for cx in range(x0, x1 + 1) for cy in range(y0, y1 + 1)]


def free(box: tuple[float, float, float, float], index: dict) -> bool:
    return not any(overlap(box, other) for cell in cells(box) for other in index.get(cell, ()))


def boxes(xs: Sequence[float], ys: Sequence[float], texts: Sequence[str], sides: Sequence[str | None],
          width: float, height: float) -> list[tuple[float, float, float, float]]:
    """The pixel boxes of the placed labels (for tests: none overlaps, all inside)."""
    px = to_pixels(xs, padded_domain(xs), width)
    py = to_pixels(ys, padded_domain(ys), height)
    out = []
    for x, y, text, where in zip(px, py, texts, sides):
        if where is None:
            continue
        w = CHAR_PX * max(1, len(text))
        x0 = x + GAP_PX if where == "right" else x - GAP_PX - w
        out.append((x0, y - LINE_PX / 2, x0 + w, y + LINE_PX / 2))
    return out
