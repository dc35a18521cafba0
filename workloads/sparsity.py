"""Sparsity statistics of embedding gradients (Zen §1-2, Table 1, Fig 2-3), on index sets.

An index set is a 1-D int64 tensor of the distinct non-zero row ids of one worker's gradient
(sorted, as torch.unique returns them); `num_rows` is M, the number of rows of the gradient.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

BLOCK = 1 << 24  # elements of one block of the membership matrix (64 MiB in float32)


def nonzero_rows(grad: torch.Tensor) -> torch.Tensor:
    """Ids of the rows of a (M, D) gradient with any non-zero element (int64, ascending)."""
    return grad.reshape(grad.shape[0], -1).ne(0).any(dim=1).nonzero().flatten()


def density(indices: torch.Tensor, num_rows: int) -> float:
    """d_G = |I| / M."""
    return indices.numel() / num_rows


def union(sets: Sequence[torch.Tensor], num_rows: int) -> torch.Tensor:
    """Non-zero rows of the sum over workers (no cancellation assumed), ascending: marked in a mask of the row
    space, linear in the ids where a sort of millions of them (16 workers' DGC choices) is not."""
    return _marked(sets, num_rows).nonzero().flatten()


def _marked(sets: Sequence[torch.Tensor], num_rows: int) -> torch.Tensor:
    mask = torch.zeros(num_rows, dtype=torch.bool)
    for s in sets:
        mask[s.long()] = True
    return mask


def intersections(sets: Sequence[torch.Tensor], num_rows: int) -> torch.Tensor:
    """|I_i ∩ I_j| of every pair of index sets (int64, W x W; the diagonal the sets' sizes): their 0/1 membership
    matrix over the union's rows times its own transpose, one matrix product where pairwise intersections cost
    W(W-1)/2 set operations. In blocks of columns, so a block stays small and its counts (below 2^24) exact in
    float32."""
    where = _marked(sets, num_rows).cumsum(0).sub_(1)  # a row's column among the union's rows
    size = int(where[-1]) + 1 if num_rows else 0
    columns = [_ascending(where[s.long()]) for s in sets]
    width = max(1, BLOCK // max(1, len(sets)))
    counts = torch.zeros(len(sets), len(sets), dtype=torch.float64)
    for start in range(0, size, width):
        block = torch.zeros(len(sets), min(width, size - start))
        for row, cols in zip(block, columns, strict=True):
            lo, hi = torch.searchsorted(cols, torch.tensor([start, start + width])).tolist()
            row[cols[lo:hi] - start] = 1.0
        counts += block @ block.T
    return counts.long()


def _ascending(ids: torch.Tensor) -> torch.Tensor:
    return ids if ids.numel() < 2 or bool((ids[1:] >= ids[:-1]).all()) else ids.sort().values


def overlaps(sets: Sequence[torch.Tensor], num_rows: int) -> dict[tuple[int, int], float]:
    """(i, j) -> |I_i ∩ I_j| / min(|I_i|, |I_j|) for i < j; 0 when either set is empty."""
    counts = intersections(sets, num_rows).tolist()
    out = {}
    for i in range(len(sets)):
        for j in range(i + 1, len(sets)):
            smaller = min(counts[i][i], counts[j][j])
            out[i, j] = counts[i][j] / smaller if smaller else 0.0
    return out


def worker_counts(n: int) -> list[int]:
    """n = 1, 2, 4, ... up to and including `n` (the x axis of Fig 2b)."""
    counts = [1 << k for k in range(n.bit_length()) if 1 << k <= n]
    return counts if counts[-1] == n else [*counts, n]


def densification(sets: Sequence[torch.Tensor], num_rows: int) -> dict[int, tuple[float, float]]:
    """n -> (d_G^n, gamma^n) for n in worker_counts(len(sets)), summing the first n workers.

    gamma^n = d_G^n / d_G, with d_G the mean density of those n workers (1 <= gamma^n <= n).
    """
    out, mask, done = {}, torch.zeros(num_rows, dtype=torch.bool), 0
    for n in worker_counts(len(sets)):
        for s in sets[done:n]:  # the union of the first n, marked one set at a time
            mask[s.long()] = True
        done = n
        d_n = int(mask.count_nonzero()) / num_rows
        d = sum(s.numel() for s in sets[:n]) / (n * num_rows)
        out[n] = (d_n, d_n / d if d else 0.0)
    return out


def partition_bounds(num_rows: int, parts: int) -> torch.Tensor:
    """parts + 1 boundaries of equal contiguous ranges (sizes differ by at most one row)."""
    return torch.arange(parts + 1) * num_rows // parts


def partition_counts(indices: torch.Tensor, num_rows: int, parts: int) -> torch.Tensor:
    """Number of non-zero rows in each of `parts` equal contiguous ranges (`partition_bounds`): row i lies in
    range j = ceil((i + 1) parts / M) - 1, the last j with floor(j M / parts) <= i (arithmetic, not a search)."""
    return ((indices.long() + 1) * parts - 1).div_(num_rows, rounding_mode="floor").bincount(minlength=parts)


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
