"""Measured bytes of every registered scheme equal the prediction from the actual index sets."""

from __future__ import annotations

import pytest
import torch

import zen
from harness.bench.patterns import make_gradient
from zen.prediction import layout_and_sets, predict

from .cases import CASES


def compare(scheme: str, tensors: list[torch.Tensor], tolerance: float = 0.0) -> None:
    seed = 77
    res = zen.simulate(scheme, tensors, seed=seed, warmup=2)  # zen measures on its first two calls
    layout, sets = layout_and_sets(tensors, seed)
    expect = predict(scheme, sets, layout)
    for r, phases in enumerate(expect):
        measured = {p: v[r] for p, v in res.phases.items() if v[r]}
        want = {p: v for p, v in phases.items() if v}
        if tolerance == 0.0:
            assert measured == want, f"{scheme} rank {r}"
        else:
            assert measured.keys() == want.keys(), f"{scheme} rank {r}"
            for p in want:
                assert abs(measured[p] - want[p]) <= tolerance * want[p], f"{scheme} rank {r} {p}"


@pytest.mark.parametrize("scheme", zen.schemes())
@pytest.mark.parametrize("pattern", ["random", "identical", "disjoint", "zipf"])
@pytest.mark.parametrize("P", [1, 3, 4, 8])
def test_patterns(scheme: str, pattern: str, P: int) -> None:
    compare(scheme, [make_gradient(pattern, 5003, 0.02, r, P, seed=3) for r in range(P)])


@pytest.mark.parametrize("scheme", zen.schemes())
@pytest.mark.parametrize("case", ["empty_ranks", "edges", "full", "matrix", "coo"])
def test_adversarial(scheme: str, case: str) -> None:
    compare(scheme, [CASES[case](r, 5, torch.float32) for r in range(5)])
