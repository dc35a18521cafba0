"""Pull encodings (paper section 4, Algorithm 2): how a server ships its aggregated partition.

- hash_bitmap: one bit per row of S_j (the rows h0 can ever send to server j) plus the non-zero
  values; every worker receives sum_j |S_j| / 8 = M / 8 bitmap bytes in total, independent of n.
- bitmap: one bit per row of the whole tensor from every server (n * M / 8 bytes), for the study.
- coo: row indices plus values.
A server's message is (payload, values); the decoder returns the row ids the values belong to.
`encode` scans the server's rows S_j in the aggregate; `encode_rows` builds the same message from the
server's non-zero rows when it already knows them (work proportional to those rows, not to |S_j|).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from zen import native

ENCODINGS = ("hash_bitmap", "coo", "bitmap")
Message = tuple[torch.Tensor, torch.Tensor]  # (payload, values)
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


def nonzero_rows(block: torch.Tensor) -> torch.Tensor:
    """Row mask of a (rows, D) block: a row is non-zero if any of its elements is."""
    return block.view(-1) != 0 if block.shape[1] == 1 else (block != 0).any(dim=1)


def encode(
    encoding: str, out: torch.Tensor, members: torch.Tensor, index_dtype: torch.dtype
) -> tuple[tuple[torch.Tensor, torch.Tensor], int]:
    """Encode the server's aggregated rows `out[members]`; returns (message, non-zero row count)."""
    if encoding == "hash_bitmap" and (fast := native.encode_hash_bitmap(out, members)) is not None:
        return fast, int(fast[1].shape[0])
    block = out.index_select(0, members)
    mask = nonzero_rows(block)
    values = block[mask]
    if encoding == "hash_bitmap":
        payload = pack_bits(mask)
    elif encoding == "coo":
        payload = members[mask].to(index_dtype)
    elif encoding == "bitmap":
        full = torch.zeros(out.shape[0], dtype=torch.bool, device=out.device)
        full[members[mask].long()] = True
        payload = pack_bits(full)
    else:
        raise ValueError(f"unknown pull encoding {encoding!r}; choose one of {', '.join(ENCODINGS)}")
    return (payload, values), int(values.shape[0])


def encode_rows(
    encoding: str, rows: torch.Tensor, block: torch.Tensor, members: torch.Tensor, num_rows: int,
    positions: Callable[[torch.Tensor], torch.Tensor], index_dtype: torch.dtype,
) -> tuple[Message, int]:
    """`encode` of a server whose non-zero rows are exactly `rows` (ascending, distinct, all in
    `members`), with values `block`: the same message bit for bit, with work proportional to len(rows)
    instead of len(members). `positions` maps rows to their index in `members` (hashing.ServerRanks);
    `num_rows` is M, for the plain bitmap."""
    if encoding == "hash_bitmap":
        payload = set_bits(positions(rows), int(members.numel()))
    elif encoding == "coo":
        payload = rows.to(index_dtype)
    elif encoding == "bitmap":
        payload = set_bits(rows.long(), num_rows)
    else:
        raise ValueError(f"unknown pull encoding {encoding!r}; choose one of {', '.join(ENCODINGS)}")
    return (payload, block), int(block.shape[0])


def set_bits(positions: torch.Tensor, length: int) -> torch.Tensor:
    """pack_bits of a mask given its distinct set positions (distinct bits, so the sum is an or)."""
    packed = torch.zeros(-(-length // 8), dtype=torch.uint8, device=positions.device)
    return packed.index_add_(0, positions >> 3, (1 << (positions & 7)).to(torch.uint8))


def decoder(encoding: str, num_rows: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Returns decode(payload, members_of_server) -> row ids of the received values."""
    if encoding == "hash_bitmap":
        return _decode_hash_bitmap
    if encoding == "coo":
        return lambda payload, members: payload
    if encoding == "bitmap":
        return lambda payload, members: unpack_bits(payload, num_rows).nonzero().view(-1)
    raise ValueError(f"unknown pull encoding {encoding!r}; choose one of {', '.join(ENCODINGS)}")


def _decode_hash_bitmap(payload: torch.Tensor, members: torch.Tensor) -> torch.Tensor:
    fast = native.decode_hash_bitmap(payload, members)
    return fast if fast is not None else members[unpack_bits(payload, int(members.numel()))]
