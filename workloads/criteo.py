"""A synthetic Criteo-like click log (no Criteo data is available offline).

Categorical features follow bounded Zipf laws (one exponent per table in [1.05, 1.2]) whose ranks
go through a fixed random permutation per table, as hashed ids do: popular ids are spread over the
table instead of crowding its first rows. One id per table per sample, 13 log-normal dense
features fed as log(1 + x) (the usual DLRM preprocessing), and clicks drawn from a logistic model of
three dense features and three categorical ids, so there is something to learn. torchrec's
RandomRecDataset draws uniform ids (overlap ~0) and is unrealistic for sparsity work.
"""

from __future__ import annotations

import torch

from workloads.common import generator

# Criteo Kaggle (Display Advertising Challenge) table sizes: 26 tables, 33.76M rows
KAGGLE_CARDINALITIES = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992,
    5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)
NUM_DENSE = 13
ZIPF_S = (1.05, 1.2)
LABEL_FEATURES = 3  # dense features and tables (the first ones) that drive the click probability


def bounded_zipf_cdf(n: int, s: float) -> torch.Tensor:
    """CDF of P(k) proportional to (k + 1)^-s on k = 0..n-1 (float64, last entry 1)."""
    cdf = torch.cumsum(torch.arange(1, n + 1, dtype=torch.float64).pow(-s), 0)
    return cdf / cdf[-1]


class CriteoLike:
    """The fixed part of the generator (same on every rank): laws, permutations, label model."""

    def __init__(self, cardinalities: tuple[int, ...], seed: int):
        g = generator(seed, 0xC417E0)
        self.cardinalities = cardinalities
        self.zipf_s = ZIPF_S[0] + (ZIPF_S[1] - ZIPF_S[0]) * torch.rand(len(cardinalities), generator=g)
        self.cdfs = [bounded_zipf_cdf(n, float(s)) for n, s in zip(cardinalities, self.zipf_s, strict=True)]
        self.perms = [torch.randperm(n, generator=g) for n in cardinalities]
        self.mu = 3.0 * torch.rand(NUM_DENSE, generator=g)
        self.sigma = 0.5 + torch.rand(NUM_DENSE, generator=g)
        self.w_dense = torch.randn(LABEL_FEATURES, generator=g)
        self.w_sparse = torch.randn(LABEL_FEATURES, generator=g)
        self.bias = -1.1  # about 25% clicks, like Criteo

    def sample(self, batch_size: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
        """One batch: dense (B, 13) float32, sparse (B, 26) int64 row ids, labels (B,) float32."""
        z = torch.randn(batch_size, NUM_DENSE, generator=gen)
        dense = torch.log1p(torch.exp(self.mu + self.sigma * z))
        ranks = [torch.searchsorted(cdf, torch.rand(batch_size, generator=gen, dtype=torch.float64),
                                    right=True).clamp_(max=len(cdf) - 1) for cdf in self.cdfs]
        sparse = torch.stack([perm[r] for perm, r in zip(self.perms, ranks, strict=True)], dim=1)
        # a fixed random +-1 effect per id: parity of the permuted id
        effects = (sparse[:, :LABEL_FEATURES] % 2) * 2.0 - 1.0
        logit = self.bias + z[:, :LABEL_FEATURES] @ self.w_dense + effects @ self.w_sparse
        labels = torch.bernoulli(torch.sigmoid(logit), generator=gen)
        return {"dense": dense, "sparse": sparse, "labels": labels}
