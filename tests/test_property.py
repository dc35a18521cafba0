"""Property-based losslessness (hypothesis): every registered scheme, on generated inputs of any world size
1-9, dtype, density, shape and layout (COO with duplicates), including exact cancellation, -0.0 and the
first and last index, returns the float64 sum within the rounding bound, identical on every rank."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zen
from harness.reference import matches_reference, reference_sum

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


@st.composite
def inputs(draw: st.DrawFn) -> list[torch.Tensor]:
    """Each rank's gradient: values on a drawn support, with cancellation, -0.0 and edge indices mixed in."""
    P = draw(st.integers(1, 9))
    dtype = draw(st.sampled_from(DTYPES))
    rows = draw(st.integers(1, 300))
    width = draw(st.sampled_from([None, 1, 3]))
    density = draw(st.sampled_from([0.0, 0.01, 0.2, 0.7, 1.0]))
    seed = draw(st.integers(0, 2**31 - 1))
    coo = draw(st.booleans())
    cancel = draw(st.booleans())
    gen = torch.Generator().manual_seed(seed)
    shape = (rows,) if width is None else (rows, width)
    grads = []
    for r in range(P):
        mask = torch.rand(rows, generator=gen) < density
        mask[[0, rows - 1]] |= torch.rand(2, generator=gen) < 0.5  # the first and the last index, often
        values = torch.randn(shape, generator=gen, dtype=torch.float64).round(decimals=2)
        values[~mask] = 0.0
        if cancel and r == P - 1 and P > 1:  # the last rank cancels the first exactly on their common rows
            values[mask] = -grads[0].to_dense().double()[mask] if grads else values[mask]
        values[mask & (torch.rand(rows, generator=gen) < 0.1)] = -0.0
        grads.append(_as_input(values.to(dtype), mask, coo, gen))
    return grads


def _as_input(dense: torch.Tensor, mask: torch.Tensor, coo: bool, gen: torch.Generator) -> torch.Tensor:
    """`dense` itself, or as an uncoalesced COO tensor whose rows are split into duplicates."""
    if not coo:
        return dense
    rows = mask.nonzero().view(-1)
    part = dense[rows] * 0.5 if dense.dtype == torch.float64 else dense[rows]
    halves = [part, dense[rows] - part] if dense.dtype == torch.float64 else [part]
    index = torch.cat([rows] * len(halves)).view(1, -1)
    return torch.sparse_coo_tensor(index, torch.cat(halves), dense.shape, check_invariants=True)


@pytest.mark.parametrize("scheme", zen.schemes())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(grads=inputs())
def test_every_scheme_is_lossless_on_generated_inputs(scheme: str, grads: list[torch.Tensor]) -> None:
    P = len(grads)
    total, magnitude = reference_sum(grads)
    res = zen.simulate(scheme, grads, warmup=1, seed=5)
    for r, out in enumerate(res.outputs):
        assert out.shape == grads[0].shape and out.dtype == grads[0].dtype
        assert matches_reference(out, total, magnitude, P), f"{scheme} rank {r}"
        assert torch.equal(out, res.outputs[0]), f"{scheme}: rank {r} differs from rank 0"
