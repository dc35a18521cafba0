"""Synthetic per-rank gradients with controlled density and overlap (the paper's study patterns).

- random: independent uniform index sets (partial overlap, like unrelated batches);
- identical: the same index set on every rank (gamma^n = 1);
- disjoint: non-overlapping sets (gamma^n = n);
- zipf: skewed towards low indices like real embedding gradients (frequent tokens get low ids).
With a compressor (`zen bench --compress`), a rank's input is instead what the compressor chooses from a
dense gradient whose half is shared by all ranks (`compressed_gradient`), so the chosen sets overlap partly,
as top-k sets of data-parallel gradients do.
Values are standard normal; every rank's generator is seeded by (seed, rank), so each rank of a real
run can rebuild all ranks' inputs and check its result against a float64 reference.
"""

from __future__ import annotations

import torch

PATTERNS = ("random", "identical", "disjoint", "zipf")
ZIPF_EXPONENT = 1.1


def nnz_for(numel: int, density: float) -> int:
    if not 0.0 <= density <= 1.0:
        raise ValueError(f"density must be in [0, 1], got {density}")
    return round(numel * density)


def index_set(pattern: str, numel: int, density: float, rank: int, world_size: int, seed: int) -> torch.Tensor:
    """Sorted int64 non-zero positions of `rank`'s gradient."""
    if pattern not in PATTERNS:
        raise ValueError(f"unknown pattern {pattern!r}; choose one of: {', '.join(PATTERNS)}")
    k = nnz_for(numel, density)
    if pattern == "identical":
        gen = torch.Generator().manual_seed(seed * 1_000_003)
        return _uniform_subset(numel, k, gen)
    if pattern == "disjoint":
        if k * world_size > numel:
            raise ValueError(f"disjoint pattern needs density * world_size <= 1 (got {density} x {world_size})")
        gen = torch.Generator().manual_seed(seed * 1_000_003)
        perm = torch.randperm(numel, generator=gen)
        return perm[rank * k : (rank + 1) * k].sort().values
    gen = torch.Generator().manual_seed(seed * 1_000_003 + 7919 * (rank + 1))
    if pattern == "random":
        return _uniform_subset(numel, k, gen)
    return _zipf_subset(numel, k, gen)


def _uniform_subset(numel: int, k: int, gen: torch.Generator) -> torch.Tensor:
    if k * 4 > numel:
        return torch.randperm(numel, generator=gen)[:k].sort().values
    picked = torch.empty(0, dtype=torch.int64)
    while picked.numel() < k:  # sample with replacement, dedupe; few rounds at low density
        draw = torch.randint(0, numel, (int((k - picked.numel()) * 1.2) + 16,), generator=gen)
        picked = torch.unique(torch.cat([picked, draw]))
    keep = torch.randperm(picked.numel(), generator=gen)[:k]
    return picked[keep].sort().values


def _zipf_subset(numel: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """k distinct indices drawn with weight 1 / (i + 1)^s (exponential clocks: the k smallest
    Exp(1) * (i + 1)^s win)."""
    if k == 0:
        return torch.empty(0, dtype=torch.int64)
    clocks = torch.empty(numel).exponential_(generator=gen)
    clocks *= torch.arange(1, numel + 1, dtype=torch.float32).pow_(ZIPF_EXPONENT)
    return torch.topk(clocks, k, largest=False, sorted=False).indices.sort().values


def make_gradient(pattern: str, numel: int, density: float, rank: int, world_size: int, seed: int,
                  dtype: torch.dtype = torch.float32, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """Dense gradient of `numel` elements whose non-zeros follow `pattern`."""
    idx = index_set(pattern, numel, density, rank, world_size, seed)
    gen = torch.Generator().manual_seed(seed * 31 + rank + 17)
    values = torch.randn(idx.numel(), generator=gen)
    values[values == 0] = 1.0
    grad = torch.zeros(numel, dtype=dtype)
    grad[idx] = values.to(dtype)
    return grad.view(shape) if shape is not None else grad



def compressed_gradient(compress: str, numel: int, density: float, rank: int, seed: int,
                        dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """What compressor `compress` of `density` sends on its first step from rank `rank`'s dense gradient:
    a shared normal component plus a per-rank one of the same scale."""
    from zen.compress import make_compressor
    from zen.compress.base import PartContext

    shared = torch.randn(numel, generator=torch.Generator().manual_seed(seed * 1_000_003))
    own = torch.randn(numel, generator=torch.Generator().manual_seed(seed * 31 + rank + 17))
    grad = shared.add_(own).to(dtype)
    make_compressor(compress, density).compress(grad, PartContext("bench", 0, 0, 1))
    return grad
