"""Float agreement relative to the values' scale, for tests comparing two computations of the same
numbers made apart: logits (or any unbounded activations), and the nested results a probe returns
(a first view saved on one machine against the probe run on this one).

A float32 sum rounds to a few ulps of its largest terms, and which ulps depends on the CPU (x86 or
ARM, its vector width, the number of threads, the order a BLAS kernel adds in): an element's error
follows the size of the whole tensor, not its own. An absolute 1e-5 on logits of size 20 failed on
another machine (1.054e-5 on 1 of 1600 elements), and a shipped first view's entropy 0.25550013086
read 0.25550013194 on another CPU (4e-9 relative). 1e-5 of the scale leaves room for the rounding
(~1e-6 of it at most here) and still catches a real difference (a wrong weight or a missing term is
far larger).

Exactness stays where it is the point: a save/load round trip, or a "left untouched" check within
one process, compares with `==` / `torch.equal`.
"""

from __future__ import annotations

import math

import torch

REL = 1e-5  # of the largest |expected| in the grid a number belongs to


def assert_close_to_scale(actual: torch.Tensor, expected: torch.Tensor, rel: float = REL) -> None:
    """actual == expected within rel x max|expected|, element by element."""
    scale = float(expected.detach().abs().max()) if expected.numel() else 0.0
    torch.testing.assert_close(actual, expected, atol=rel * scale, rtol=0)


def _largest(value) -> float:
    """The largest finite |float| in a nested list / dict (ints, bools and strings are labels, not scale)."""
    if isinstance(value, float):
        return abs(value) if math.isfinite(value) else 0.0
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        return max((_largest(v) for v in value), default=0.0)
    return 0.0


def agree(actual, expected, rel: float = REL, scale: float | None = None) -> bool:
    """Nested results equal in structure, types and labels, their floats within rel x the scale of the
    list they belong to (the outermost list holding them: a grid's largest |value|; a lone float its own
    size). NaN agrees with NaN, inf with the same inf; ints, strings and None must be equal."""
    if isinstance(expected, dict):
        return (isinstance(actual, dict) and actual.keys() == expected.keys()
                and all(agree(actual[k], expected[k], rel, scale) for k in expected))
    if isinstance(expected, list):
        scale = _largest(expected) if scale is None else scale
        return (isinstance(actual, list) and len(actual) == len(expected)
                and all(agree(a, e, rel, scale) for a, e in zip(actual, expected)))
    if isinstance(expected, float) and isinstance(actual, float):
        if math.isnan(expected) or math.isinf(expected):
            return math.isnan(actual) if math.isnan(expected) else actual == expected
        return abs(actual - expected) <= rel * (abs(expected) if scale is None else scale)
    return type(actual) is type(expected) and actual == expected


def differences(actual, expected, rel: float = REL, where: str = "") -> list[str]:
    """Where `agree` fails, as paths with both values (for an assertion's message)."""
    if agree(actual, expected, rel):
        return []
    if isinstance(expected, dict) and isinstance(actual, dict) and actual.keys() == expected.keys():
        return [d for k in expected for d in differences(actual[k], expected[k], rel, f"{where}/{k}")]
    return [f"{where}: {str(actual)[:200]} vs {str(expected)[:200]}"]
