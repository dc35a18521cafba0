"""Sparsity statistics of embedding gradients (Zen §1-2, Table 1, Fig 2-3), on index sets.

An index set is a 1-D int64 tensor of the distinct non-zero row ids of one worker's gradient
(sorted, as torch.unique returns them); `num_rows` is M, the number of rows of the gradient.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def nonzero_rows(grad: torch.Tensor) -> torch.Tensor:
    """Ids of the rows of a (M, D) gradient with any non-zero element (int64, ascending)."""
    return grad.reshape(grad.shape[0], -1).ne(0).any(dim=1).nonzero().flatten()


def density(indices: torch.Tensor, num_rows: int) -> float:
    """d_G = |I| / M."""
    return indices.numel() / num_rows


def overlap_ratio(a: torch.Tensor, b: torch.Tensor) -> float:
    """|I_1 ∩ I_2| / min(|I_1|, |I_2|); 0 when either set is empty."""
    smaller = min(a.numel(), b.numel())
    return torch.isin(a, b).sum().item() / smaller if smaller else 0.0


def union(sets: Sequence[torch.Tensor]) -> torch.Tensor:
    """Non-zero rows of the sum over workers (no cancellation assumed)."""
    return torch.unique(torch.cat(list(sets)))


def worker_counts(n: int) -> list[int]:
    """n = 1, 2, 4, ... up to and including `n` (the x axis of Fig 2b)."""
    counts = [1 << k for k in range(n.bit_length()) if 1 << k <= n]
    return counts if counts[-1] == n else [*counts, n]


def densification(sets: Sequence[torch.Tensor], num_rows: int) -> dict[int, tuple[float, float]]:
    """n -> (d_G^n, gamma^n) for n in worker_counts(len(sets)), summing the first n workers.

    gamma^n = d_G^n / d_G, with d_G the mean density of those n workers (1 <= gamma^n <= n).
    """
    out = {}
    for n in worker_counts(len(sets)):
        d_n = density(union(sets[:n]), num_rows)
        d = sum(s.numel() for s in sets[:n]) / (n * num_rows)
        out[n] = (d_n, d_n / d if d else 0.0)
    return out


def partition_bounds(num_rows: int, parts: int) -> torch.Tensor:
    """parts + 1 boundaries of equal contiguous ranges (sizes differ by at most one row)."""
    return torch.arange(parts + 1) * num_rows // parts


def partition_counts(indices: torch.Tensor, num_rows: int, parts: int) -> torch.Tensor:
    """Number of non-zero rows in each of `parts` equal contiguous ranges."""
    bounds = partition_bounds(num_rows, parts)
    return torch.bucketize(indices, bounds[1:], right=True).bincount(minlength=parts)


def partition_shares(indices: torch.Tensor, num_rows: int, parts: int) -> list[float]:
    """Share of the non-zero rows falling in each range (Fig 3a); zeros for an empty set."""
    counts = partition_counts(indices, num_rows, parts).double()
    total = counts.sum().item()
    return (counts / total).tolist() if total else [0.0] * parts


def skewness(indices: torch.Tensor, num_rows: int, parts: int) -> float:
    """s = max_j d(G_j) / d(G) over `parts` equal contiguous ranges G_j (Fig 3b); 0 if G is zero."""
    if indices.numel() == 0:
        return 0.0
    sizes = partition_bounds(num_rows, parts).diff().double()
    part_density = partition_counts(indices, num_rows, parts).double() / sizes.clamp(min=1)
    return part_density.max().item() / density(indices, num_rows)
