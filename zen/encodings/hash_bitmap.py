"""The hash bitmap (paper section 4, Algorithm 2): one bit per row of S_j (the rows h0 can ever send to
server j) plus the non-zero values. Every worker receives sum_j |S_j| / 8 = M / 8 bitmap bytes in
total, independent of n. Native kernels encode, decode and scatter in one pass where available."""

from __future__ import annotations

import torch

from zen import native
from zen.bits import pack_bits, set_bits, unpack_bits
from zen.encodings import Encoding, Positions, PullMessage, register_encoding
from zen.types import WireLayout


@register_encoding("hash_bitmap")
class HashBitmap(Encoding):
    words = True

    def encode(self, out: torch.Tensor, members: torch.Tensor, index_dtype: torch.dtype) -> tuple[PullMessage, int]:
        if (fast := native.encode_hash_bitmap(out, members)) is not None:
            return fast, int(fast[1].shape[0])
        return super().encode(out, members, index_dtype)

    def aggregate(self, received: list[PullMessage], words: torch.Tensor, num_rows: int
                  ) -> tuple[PullMessage, int] | None:
        if (fast := native.aggregate_hash_bitmap(received, words, num_rows)) is None:
            return None
        return fast, int(fast[1].shape[0])

    def scan_payload(self, mask: torch.Tensor, members: torch.Tensor, num_rows: int,
                     index_dtype: torch.dtype) -> torch.Tensor:
        return pack_bits(mask)

    def rows_payload(self, rows: torch.Tensor, members: torch.Tensor, num_rows: int, positions: Positions,
                     index_dtype: torch.dtype) -> torch.Tensor:
        return set_bits(positions(rows), int(members.numel()))

    def decode(self, payload: torch.Tensor, members: torch.Tensor, num_rows: int) -> torch.Tensor:
        fast = native.decode_hash_bitmap(payload, members)
        return fast if fast is not None else members[unpack_bits(payload, int(members.numel()))]

    def scatter(self, out: torch.Tensor, payload: torch.Tensor, members: torch.Tensor, values: torch.Tensor,
                num_rows: int) -> None:
        if not native.scatter_hash_bitmap(out, payload, members, values):
            super().scatter(out, payload, members, values, num_rows)

    def payload_bytes(self, owned: int, nonzero: int, layout: WireLayout) -> int:
        return -(-owned // 8) + nonzero * layout.width * layout.value_bytes

    def payload_rows(self, owned: int, nonzero: int, num_rows: int) -> int:
        return -(-owned // 8)

    def pull_bytes(self, w: WireLayout, union: float) -> float:
        return (w.world_size - 1) / w.world_size * (w.rows / 8 + union * w.width * w.value_bytes)
