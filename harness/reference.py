"""The float64 reference every scheme must reproduce, and the rounding bound it is checked with."""

from __future__ import annotations

import torch


def reference_sum(grads: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum, sum of absolute values) over ranks, in float64."""
    total = torch.zeros(grads[0].shape, dtype=torch.float64)
    magnitude = torch.zeros_like(total)
    for g in grads:
        g64 = g.to_dense().double() if g.layout == torch.sparse_coo else g.double()
        total += g64
        magnitude += g64.abs()
    return total, magnitude


def matches_reference(out: torch.Tensor, total: torch.Tensor, magnitude: torch.Tensor, world_size: int) -> bool:
    """|out - sum| <= (P + 1) * eps * sum|x|: the bound of any summation order of P terms, plus the
    final rounding to the output dtype. Exact zeros must stay exact."""
    eps = torch.finfo(out.dtype).eps
    err = (out.double() - total).abs()
    return bool((err <= (world_size + 1) * eps * magnitude).all())
