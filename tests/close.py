"""Float agreement relative to the values' scale, for tests comparing two computations of logits
(or any unbounded activations).

A float32 sum rounds to a few ulps of its largest terms, and which ulps depends on the CPU (x86 or
ARM, its vector width, the order a BLAS kernel adds in): an element's error follows the size of
the whole tensor, not its own. An absolute 1e-5 on logits of size 20 failed on another machine
(1.054e-5 on 1 of 1600 elements); 1e-5 of the scale leaves room for the rounding (~5e-7 of it
here) and still catches a real difference (a wrong weight or a missing term is of that size).
"""

from __future__ import annotations

import torch

REL = 1e-5  # of the largest |expected|


def assert_close_to_scale(actual: torch.Tensor, expected: torch.Tensor, rel: float = REL) -> None:
    """actual == expected within rel x max|expected|, element by element."""
    scale = float(expected.detach().abs().max()) if expected.numel() else 0.0
    torch.testing.assert_close(actual, expected, atol=rel * scale, rtol=0)
