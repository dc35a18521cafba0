"""Random-k sparsification with error feedback: k = density x n elements drawn at random, the same ones on
every rank (the seed is the part's tag and the step), so the ranks' index sets overlap fully."""

from __future__ import annotations

import torch

from zen.compress import register_compressor
from zen.compress.base import Compressor, PartContext


@register_compressor("randomk")
class RandomK(Compressor):
    def __init__(self, density: float = 0.05, seed: int = 0):
        super().__init__(density)
        self.seed = seed

    def select(self, acc: torch.Tensor, ctx: PartContext) -> torch.Tensor:
        k, dev = self.keep(acc.numel(), ctx), acc.device
        gen = torch.Generator(device=dev).manual_seed((self.seed * 1_000_003 + ctx.tag * 7_919 + ctx.step) % 2**63)
        if k * 4 >= acc.numel():
            return torch.randperm(acc.numel(), generator=gen, device=dev)[:k].sort().values
        return torch.randint(acc.numel(), (k,), generator=gen, device=dev).unique()  # ~k, sorted
