"""Scaled sign compression with error feedback (EF-SignSGD, Karimireddy et al., ICML'19): each rank sends
one bit per element and one scale, mean |g + e|, and keeps e = (g + e) - scale x sign(g + e). The signs of
different ranks cannot be added as bits, so the codes travel by one all-gather (phase `gather`) and every
rank decodes and adds them in rank order: the result is exactly the sum of the ranks' scale x sign, the
same bits on every rank. 1/32 of fp32's volume per rank and peer; no scheme is involved."""

from __future__ import annotations

import torch

from zen.comm.base import gather_v_meta
from zen.compress import register_compressor
from zen.compress.base import PartContext, Quantizer

_BITS = 2 ** torch.arange(8, dtype=torch.uint8)


def pack_signs(x: torch.Tensor) -> torch.Tensor:
    """One bit per element (1: x >= 0), eight to a byte, little-endian within the byte."""
    bits = (x >= 0).to(torch.uint8)
    pad = (-bits.numel()) % 8
    if pad:
        bits = torch.cat([bits, bits.new_zeros(pad)])
    return (bits.view(-1, 8) * _BITS.to(bits.device)).sum(1, dtype=torch.uint8)


def unpack_signs(packed: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """+1 / -1 per element from `pack_signs`' bytes."""
    bits = packed.view(-1, 1).bitwise_and(_BITS.to(packed.device)).ne(0).view(-1)[:numel]
    return bits.to(dtype).mul_(2).sub_(1)


@register_compressor("sign")
class ScaledSign(Quantizer):
    def quantize(self, tensor: torch.Tensor, ctx: PartContext) -> tuple[torch.Tensor, torch.Tensor]:
        """scale x sign of the error-compensated gradient into `tensor`; returns (packed signs, scale)."""
        flat = tensor.view(-1)
        acc = self._accumulate(flat, ctx)
        scale = acc.abs().mean()
        codes = (pack_signs(acc), scale.view(1).to(torch.float32))
        flat.copy_(self.decode(codes, flat.numel(), flat.dtype))
        acc.sub_(flat)
        return codes

    def decode(self, codes: tuple[torch.Tensor, ...], numel: int, dtype: torch.dtype) -> torch.Tensor:
        packed, scale = codes
        return unpack_signs(packed, numel, dtype).mul_(scale.to(dtype=dtype, device=packed.device))

    def predict(self, world_size: int, numel: int) -> dict[str, int]:
        """Every peer's packed signs and scale, and the all-gather's sizes and row counts."""
        if world_size == 1:
            return {}
        return {"gather": (world_size - 1) * ((numel + 7) // 8 + 4),
                "meta": gather_v_meta(world_size)}
