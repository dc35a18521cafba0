"""Bit vectors as packed bytes (little-endian within a byte): the hash bitmap's payload and S_j's membership
bits. A module of its own below hashing and the encodings, which both use it."""

from __future__ import annotations

import torch

_BIT_WEIGHTS: dict[torch.device, torch.Tensor] = {}


def pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """Bool vector -> uint8 bytes, little-endian bit order, ceil(len / 8) bytes."""
    n = int(mask.numel())
    pad = (-n) % 8
    if pad:
        mask = torch.cat([mask, mask.new_zeros(pad)])
    w = _BIT_WEIGHTS.get(mask.device)
    if w is None:
        w = _BIT_WEIGHTS.setdefault(mask.device, (1 << torch.arange(8, device=mask.device)).to(torch.uint8))
    return (mask.view(-1, 8).to(torch.uint8) * w).sum(dim=1, dtype=torch.uint8)


def unpack_bits(packed: torch.Tensor, length: int) -> torch.Tensor:
    shifts = torch.arange(8, device=packed.device, dtype=torch.uint8)
    bits = (packed.view(-1, 1) >> shifts) & 1
    return bits.view(-1)[:length].bool()


def set_bits(positions: torch.Tensor, length: int) -> torch.Tensor:
    """pack_bits of a mask given its distinct set positions (distinct bits, so the sum is an or)."""
    packed = torch.zeros(-(-length // 8), dtype=torch.uint8, device=positions.device)
    return packed.index_add_(0, positions >> 3, (1 << (positions & 7)).to(torch.uint8))
