"""Top-k sparsification with error feedback: the k = density x n largest magnitudes of the
error-compensated gradient. Exact (torch.topk), or `sampled`: DGC's threshold estimated on a random sample,
then an exact top-k only among the elements above it (Lin et al., ICLR'18, §3: fewer passes than a full
top-k selection)."""

from __future__ import annotations

import torch

from zen.compress import register_compressor
from zen.compress.base import Compressor, PartContext, sorted_ids

MIN_SAMPLE = 1024


def exact_topk(acc: torch.Tensor, k: int) -> torch.Tensor:
    """Ascending ids of the k largest |acc| (ties broken by torch.topk)."""
    if k >= acc.numel():
        return torch.arange(acc.numel(), device=acc.device)
    return sorted_ids(acc.abs().topk(k, sorted=False).indices)


def sampled_topk(acc: torch.Tensor, k: int, sample: float, gen: torch.Generator) -> torch.Tensor:
    """About the k largest |acc|: the threshold is the matching quantile of a random sample; if more than k
    pass it, the k largest of those; if fewer than k / 2 (a sample that missed the tail), the exact top-k."""
    n = acc.numel()
    m = min(n, max(MIN_SAMPLE, int(n * sample)))
    if m >= n or k >= n:
        return exact_topk(acc, k)
    mag = acc.abs()
    picks = torch.randint(n, (m,), generator=gen, device=acc.device)
    kept = max(1, round(k * m / n))
    threshold = mag.index_select(0, picks).topk(kept, sorted=True).values[-1]
    ids = (mag >= threshold if threshold > 0 else mag > 0).nonzero().view(-1)
    if ids.numel() > k:
        return sorted_ids(ids.index_select(0, mag.index_select(0, ids).topk(k, sorted=False).indices))
    if ids.numel() < k // 2:
        return exact_topk(acc, k)
    return ids


@register_compressor("topk")
class TopK(Compressor):
    """`sampled`: estimate the threshold from `sample` x n elements (default exact)."""

    def __init__(self, density: float = 0.05, sampled: bool = False, sample: float = 0.01, seed: int = 0):
        super().__init__(density)
        self.sampled, self.sample, self.seed = sampled, sample, seed
        self.gen = torch.Generator().manual_seed(seed)  # its own stream: the training RNG is left alone

    def select(self, acc: torch.Tensor, ctx: PartContext) -> torch.Tensor:
        k = self.keep(acc.numel(), ctx)
        return sampled_topk(acc, k, self.sample, self.gen) if self.sampled else exact_topk(acc, k)
