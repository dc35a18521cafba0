"""Measured bytes of every registered scheme equal the prediction from the actual index sets."""

from __future__ import annotations

import pytest
import torch

import zen
from harness.bench.patterns import make_gradient

from .cases import CASES
from .helpers import compare


@pytest.mark.parametrize("scheme", zen.schemes())
@pytest.mark.parametrize("pattern", ["random", "identical", "disjoint", "zipf"])
@pytest.mark.parametrize("P", [1, 3, 4, 8])
def test_patterns(scheme: str, pattern: str, P: int) -> None:
    compare(scheme, [make_gradient(pattern, 5003, 0.02, r, P, seed=3) for r in range(P)])


@pytest.mark.parametrize("scheme", zen.schemes())
@pytest.mark.parametrize("case", ["empty_ranks", "edges", "full", "matrix", "coo"])
def test_adversarial(scheme: str, case: str) -> None:
    compare(scheme, [CASES[case](r, 5, torch.float32) for r in range(5)])
