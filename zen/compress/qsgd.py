"""QSGD (Alistarh et al., NeurIPS'17) with error feedback: the part is cut into buckets of `bucket` elements
(QSGD's bucketing: its variance grows with sqrt(bucket) / levels, so one norm for a whole part would swamp
the gradient); each rank sends every bucket's L2 norm and, per element, a sign and a level l in 0..s, rounded
up or down at random so that the expected code is the error-compensated gradient; the residual keeps what
the rounding left out. The codes travel as one byte per element (level, sign in the top bit: s <= 127) and a
float per bucket, by one all-gather (phase `gather`); every rank decodes and adds them in rank order with
the sender's arithmetic, so the result is exactly the sum of the ranks' quantized values, the same bits on
every rank. About a quarter of fp32's volume per rank and peer."""

from __future__ import annotations

import torch

from zen.comm.base import gather_v_meta
from zen.compress import register_compressor
from zen.compress.base import PartContext, Quantizer
from zen.types import ZenInputError

SIGN_BIT = 128


@register_compressor("qsgd")
class QSGD(Quantizer):
    def __init__(self, density: float = 0.05, levels: int = 16, bucket: int = 128, seed: int = 0) -> None:
        super().__init__(density)
        if not 1 <= levels < SIGN_BIT:
            raise ZenInputError(f"qsgd levels must be in 1..{SIGN_BIT - 1}, got {levels}")
        if bucket < 1:
            raise ZenInputError(f"qsgd bucket must be >= 1, got {bucket}")
        self.levels, self.bucket, self.seed = levels, bucket, seed

    def quantize(self, tensor: torch.Tensor, ctx: PartContext) -> tuple[torch.Tensor, torch.Tensor]:
        """`compress`'s work; returns the codes (one byte per element) and the buckets' scales (norm / s)."""
        flat = tensor.view(-1)
        acc = self._accumulate(flat, ctx)
        n, b = acc.numel(), self.bucket
        padded = torch.zeros(-(-n // b) * b, dtype=torch.float32, device=acc.device)
        padded[:n] = acc
        rows = padded.view(-1, b)
        norms = rows.norm(dim=1)
        ratio = rows.abs().div_(torch.where(norms > 0, norms, 1.0).unsqueeze(1)).mul_(self.levels).view(-1)[:n]
        low = ratio.floor()
        coins = torch.rand(n, generator=self.generator(ratio.device), device=ratio.device)  # the rounding's coins
        level = low.add_(coins < ratio.sub_(low)).clamp_(max=self.levels).to(torch.uint8)
        codes = level.bitwise_or_((acc < 0).to(torch.uint8).mul_(SIGN_BIT))
        scales = norms.div_(self.levels)
        flat.copy_(self.decode((codes, scales), n, flat.dtype))
        acc.sub_(flat)
        return codes, scales

    def decode(self, codes: tuple[torch.Tensor, ...], numel: int, dtype: torch.dtype) -> torch.Tensor:
        """sign x level x its bucket's scale (norm / s) per element."""
        levels, scales = codes
        value = levels.bitwise_and(SIGN_BIT - 1).to(torch.float32)
        value.mul_(scales.to(levels.device).repeat_interleave(self.bucket)[:numel])
        return torch.where(levels >= SIGN_BIT, -value, value).to(dtype)

    def predict(self, world_size: int, numel: int) -> dict[str, int]:
        """Every peer's codes and scales, and the all-gather's sizes and row counts."""
        if world_size == 1:
            return {}
        return {"gather": (world_size - 1) * (numel + 4 * -(-numel // self.bucket)),
                "meta": gather_v_meta(world_size)}
