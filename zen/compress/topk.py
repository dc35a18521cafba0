"""Top-k sparsification with error feedback: the k = density x n largest magnitudes of the
error-compensated gradient. Exact (torch.topk), or `sampled`: DGC's threshold estimated on a random sample,
then an exact top-k only among the elements above it (Lin et al., ICLR'18, §3: fewer passes than a full
top-k selection). The sampled path sweeps the part once (zen.native.sweep_threshold: accumulate, compare,
send and keep in one pass), with a torch-op fallback that chooses the same elements."""

from __future__ import annotations

import torch

from zen import native
from zen.compress import register_compressor
from zen.compress.base import Compressor, PartContext, send, sorted_ids, take
from zen.device import accelerated

MIN_SAMPLE = 1024


def exact_topk(acc: torch.Tensor, k: int) -> torch.Tensor:
    """Ascending ids of the k largest |acc| (ties broken by torch.topk)."""
    if k >= acc.numel():
        return torch.arange(acc.numel(), device=acc.device)
    return sorted_ids(acc.abs().topk(k, sorted=False).indices)


def trim_largest(res: torch.Tensor, flat: torch.Tensor, ids: torch.Tensor, values: torch.Tensor, k: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the k largest |values| of a sweep's (ids, values) sent, ties to the lower ids (a rule that no
    selection algorithm's tie order decides, so native and torch paths agree); the rest go back to `res`
    and become zero in `flat`."""
    trimmed = native.trim_largest(res, flat, ids, values, k)
    if trimmed is not None:
        return trimmed
    mag = values.abs()
    tau = mag.kthvalue(mag.numel() - k + 1).values
    keep = mag > tau
    tie = mag == tau
    keep |= tie & (tie.cumsum(0) <= k - keep.sum())
    back = ids[~keep]
    res.index_copy_(0, back, values[~keep])
    flat.index_fill_(0, back, 0)
    return ids[keep], values[keep]


def sampled_choose(src: torch.Tensor, res: torch.Tensor, flat: torch.Tensor, k: int, sample: float,
                   gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Compressor.choose with about the k largest |res + src|: the threshold is the matching quantile of a
    random sample; if more than k pass it, the k largest of those (`trim_largest`; the rest go back to the
    residual); if fewer than k / 2 (a sample that missed the tail), the exact top-k."""
    n = res.numel()
    m = min(n, max(MIN_SAMPLE, int(n * sample)))
    if m >= n or k >= n:
        return send(src, res, flat, lambda acc: exact_topk(acc, k))
    picks = torch.randint(n, (m,), generator=gen, device=res.device)
    kept = max(1, round(k * m / n))
    sampled = (res.index_select(0, picks) + src.index_select(0, picks)).abs()
    threshold = sampled.topk(kept, sorted=True).values[-1]
    if accelerated(res.device):  # the same choice without reading the threshold on the host
        floor = torch.nan_to_num(threshold, nan=0.0)
        ids, values = send(src, res, flat, lambda acc: ((acc.abs() >= floor) & (acc != 0)).nonzero().view(-1))
    else:
        strict = not bool(threshold > 0)  # a zero (or NaN) quantile: every non-zero passes
        swept = native.sweep_threshold(res, src, flat, 0.0 if strict else float(threshold), strict)
        if swept is None:
            swept = send(src, res, flat, lambda acc: (acc.abs() > 0 if strict else acc.abs() >= threshold)
                         .nonzero().view(-1))
        ids, values = swept
    if ids.numel() > k:
        return trim_largest(res, flat, ids, values, k)
    if ids.numel() < k // 2:
        res.index_copy_(0, ids, values)  # the residual is the whole error-compensated gradient again
        flat.index_fill_(0, ids, 0)
        return take(res, flat, exact_topk(res, k))
    return ids, values


@register_compressor("topk")
class TopK(Compressor):
    """`sampled`: estimate the threshold from `sample` x n elements (default exact)."""

    def __init__(self, density: float = 0.05, sampled: bool = False, sample: float = 0.01, seed: int = 0):
        super().__init__(density)
        self.sampled, self.sample, self.seed = sampled, sample, seed

    def choose(self, src: torch.Tensor, res: torch.Tensor, flat: torch.Tensor, ctx: PartContext
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.sampled:
            return sampled_choose(src, res, flat, self.keep(res.numel(), ctx), self.sample,
                                  self.generator(res.device))
        return super().choose(src, res, flat, ctx)

    def select(self, acc: torch.Tensor, ctx: PartContext) -> torch.Tensor:
        return exact_topk(acc, self.keep(acc.numel(), ctx))
