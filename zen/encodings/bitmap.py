"""Plain bitmap pull, for the encoding study (paper section 4, Fig 17): one bit per row of the whole
tensor from every server, n * M / 8 bitmap bytes per worker, plus the non-zero values."""

from __future__ import annotations

import torch

from zen.bits import pack_bits, set_bits, unpack_bits
from zen.encodings import Encoding, Positions, register_encoding
from zen.types import WireLayout


@register_encoding("bitmap")
class Bitmap(Encoding):
    def scan_payload(self, mask: torch.Tensor, members: torch.Tensor, num_rows: int,
                     index_dtype: torch.dtype) -> torch.Tensor:
        full = torch.zeros(num_rows, dtype=torch.bool, device=members.device)
        full[members[mask].long()] = True
        return pack_bits(full)

    def rows_payload(self, rows: torch.Tensor, members: torch.Tensor, num_rows: int, positions: Positions,
                     index_dtype: torch.dtype) -> torch.Tensor:
        return set_bits(rows.long(), num_rows)

    def decode(self, payload: torch.Tensor, members: torch.Tensor, num_rows: int) -> torch.Tensor:
        return unpack_bits(payload, num_rows).nonzero().view(-1)

    def payload_bytes(self, owned: int, nonzero: int, layout: WireLayout) -> int:
        return -(-layout.rows // 8) + nonzero * layout.width * layout.value_bytes

    def payload_rows(self, owned: int, nonzero: int, num_rows: int) -> int:
        return -(-num_rows // 8)

    def pull_bytes(self, w: WireLayout, union: float) -> float:
        return (w.world_size - 1) * w.rows / 8 + (w.world_size - 1) / w.world_size * union * w.width * w.value_bytes
