"""Deep Gradient Compression (Lin et al., ICLR'18), §3: top-k of the locally accumulated velocity with
momentum correction (u = m u + g, v = v + u, send top-k of v), momentum factor masking (sent elements leave
both u and v), local gradient clipping (the gradient's norm capped at clip_norm / sqrt(N) before it is
accumulated), and density warm-up (exponentially from `warmup_density` down to `density` over
`warmup_steps`). The threshold comes from a sample (zen.compress.topk.sampled_choose).

Momentum correction replaces the optimizer's momentum: train with `momentum` here and none in the optimizer
(momentum=0 leaves plain error feedback)."""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable

import torch

from zen.compress import register_compressor
from zen.compress.base import Compressor, PartContext
from zen.compress.topk import sampled_choose
from zen.device import accelerated


@register_compressor("dgc")
class DGC(Compressor):
    def __init__(self, density: float = 0.05, momentum: float = 0.9, clip_norm: float | None = None,
                 warmup_steps: int = 0, warmup_density: float = 0.25, sample: float = 0.01, seed: int = 0):
        super().__init__(density)
        self.momentum, self.clip_norm, self.sample, self.seed = momentum, clip_norm, sample, seed
        self.warmup_steps, self.warmup_density = warmup_steps, max(warmup_density, density)
        self.momenta: dict[Hashable, torch.Tensor] = {}

    def density_at(self, step: int) -> float:
        """The warm-up schedule: warmup_density x (density / warmup_density) ** (step / warmup_steps)."""
        if step >= self.warmup_steps:
            return self.density
        return self.warmup_density * (self.density / self.warmup_density) ** (step / self.warmup_steps)

    def keep(self, numel: int, ctx: PartContext) -> int:
        return max(1, min(numel, math.ceil(self.density_at(ctx.step) * numel)))

    def _incoming(self, flat: torch.Tensor, ctx: PartContext) -> torch.Tensor:
        """Local gradient clipping, then momentum correction: the velocity u = m u + g is what accumulates."""
        if self.clip_norm is not None:
            limit = self.clip_norm / math.sqrt(ctx.world)
            if accelerated(flat.device):  # no host read: scale by min(1, limit / norm)
                flat.mul_(torch.clamp(limit / flat.norm(), max=1.0))
            else:
                norm = float(flat.norm())
                if norm > limit:
                    flat.mul_(limit / norm)
        if not self.momentum:
            return flat
        u = self.momenta.get(ctx.key)
        if u is None or u.shape != flat.shape:
            u = self.momenta[ctx.key] = torch.zeros_like(flat)
        return u.mul_(self.momentum).add_(flat)

    def prune(self, keep: Iterable[Hashable]) -> None:
        kept = set(keep)
        super().prune(kept)
        for key in list(self.momenta):
            if key not in kept:
                del self.momenta[key]

    def choose(self, src: torch.Tensor, res: torch.Tensor, flat: torch.Tensor, ctx: PartContext
               ) -> tuple[torch.Tensor, torch.Tensor]:
        ids, values = sampled_choose(src, res, flat, self.keep(res.numel(), ctx), self.sample,
                                     self.generator(res.device))
        if self.momentum:  # momentum factor masking: sent elements leave the velocity too
            self.momenta[ctx.key].index_fill_(0, ids, 0)
        return ids, values
