"""COO pull: the non-zero rows' ids plus their values (what Sparse PS sends; the push always uses it)."""

from __future__ import annotations

import torch

from zen.encodings import Encoding, Positions, register_encoding
from zen.types import WireLayout


@register_encoding("coo")
class Coo(Encoding):
    def scan_payload(self, mask: torch.Tensor, members: torch.Tensor, num_rows: int,
                     index_dtype: torch.dtype) -> torch.Tensor:
        return members[mask].to(index_dtype)

    def rows_payload(self, rows: torch.Tensor, members: torch.Tensor, num_rows: int, positions: Positions,
                     index_dtype: torch.dtype) -> torch.Tensor:
        return rows.to(index_dtype)

    def decode(self, payload: torch.Tensor, members: torch.Tensor, num_rows: int) -> torch.Tensor:
        return payload

    def payload_bytes(self, owned: int, nonzero: int, layout: WireLayout) -> int:
        return nonzero * layout.coo_row

    def payload_rows(self, owned: int, nonzero: int, num_rows: int) -> int:
        return nonzero

    def pull_bytes(self, w: WireLayout, union: float) -> float:
        return (w.world_size - 1) / w.world_size * union * w.coo_row
