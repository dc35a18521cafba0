"""Scaled sign compression with error feedback (EF-SignSGD, Karimireddy et al., ICML'19): each rank sends
one bit per element and one scale, mean |g + e|, and keeps e = (g + e) - scale x sign(g + e). The signs of
different ranks cannot be added as bits, so the codes travel by one all-gather (phase `gather`) and every
rank decodes and adds them in rank order: the result is exactly the sum of the ranks' scale x sign, the
same bits on every rank. 1/32 of fp32's volume per rank and peer; no scheme is involved."""

from __future__ import annotations

import torch

from zen.comm.base import Communicator
from zen.compress import register_compressor
from zen.compress.base import Compressor, PartContext
from zen.grad import LocalGrad
from zen.prediction import gather_v_meta

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
class ScaledSign(Compressor):
    own_exchange = True

    def compress(self, tensor: torch.Tensor, ctx: PartContext) -> LocalGrad:
        """Overwrite `tensor` with scale x sign of the error-compensated gradient (the residual keeps the
        rest); as dense rows: every element is sent."""
        self._quantize(tensor, ctx)
        return LocalGrad(tensor.numel(), 1, tensor.dtype, tensor.device, dense=tensor.view(-1, 1))

    def _quantize(self, tensor: torch.Tensor, ctx: PartContext) -> tuple[torch.Tensor, torch.Tensor]:
        """`compress`'s work; returns the codes (packed signs, scale)."""
        flat = tensor.view(-1)
        acc = self._accumulate(flat, ctx)
        scale = acc.abs().mean()
        codes = (pack_signs(acc), scale.view(1).to(torch.float32))
        torch.mul(torch.where(acc >= 0, 1.0, -1.0).to(acc.dtype), scale, out=flat)
        acc.sub_(flat)
        return codes

    @staticmethod
    def predict(world_size: int, numel: int) -> dict[str, int]:
        """Bytes each rank receives per phase for one part of `numel` elements (as zen.prediction does for
        schemes): every peer's packed signs and scale, and the all-gather's sizes and row counts."""
        if world_size == 1:
            return {}
        return {"gather": (world_size - 1) * ((numel + 7) // 8 + 4),
                "meta": gather_v_meta(world_size, 2)}

    def select(self, acc: torch.Tensor, ctx: PartContext) -> torch.Tensor:
        raise NotImplementedError("sign sends every element")

    def exchange(self, tensor: torch.Tensor, ctx: PartContext, comm: Communicator, out: torch.Tensor,
                 divisor: int) -> None:
        """Compress `tensor`, all-gather the codes, write sum / divisor into `out` (may be `tensor`)."""
        codes = comm.all_gather_v(self._quantize(tensor, ctx), phase="gather")
        flat = out.view(-1)
        flat.zero_()
        for packed, scale in codes:
            flat.add_(unpack_signs(packed, flat.numel(), flat.dtype), alpha=float(scale))
        if divisor != 1:
            flat.div_(divisor)
