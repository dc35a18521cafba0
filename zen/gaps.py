"""The gap coding of ascending row ids: each id as the LEB128 varint of its distance to the previous one
minus one (the first as itself), 7 bits per byte with the high bit saying "more follows".

Why: a COO message spends 4 bytes on each id. A compressed gradient (top-k, DGC) has rows of one value, so
its ids are half of HC's bytes, and at the densities a sparsifier keeps (a few percent) ids are rarely 128 or
more apart: one byte each. The coding is lossless, so the sums stay exact; `nbytes` is what it costs, for
`predict`, and `bytes_per_id` the expectation the cost model charges. Native kernels do both directions in
one pass (zen.native); the torch-op path here gives the same bytes on any device.
"""

from __future__ import annotations

import torch

from zen import native
from zen.types import ZenCommError

MAX_CODE = 10  # bytes of one 64-bit gap


def _gaps(ids: torch.Tensor) -> torch.Tensor:
    ids = ids.long()
    return torch.diff(ids, prepend=ids.new_full((1,), -1)) - 1


def _lengths(gaps: torch.Tensor) -> torch.Tensor:
    """Bytes of each gap's code: 1 + how many 7-bit groups lie above its lowest."""
    n = torch.ones_like(gaps)
    for shift in range(7, 7 * MAX_CODE, 7):
        n += (gaps >> shift) > 0
    return n


def room_bytes(count: int, dtype: torch.dtype) -> int:
    """Bytes `encode` may need for `count` ids of `dtype` (every gap at its longest, and a spare word's)."""
    return count * -(-8 * dtype.itemsize // 7) + 2


def encode(ids: torch.Tensor, room: torch.Tensor | None = None) -> torch.Tensor:
    """Ascending distinct ids >= 0 (any int dtype) as a uint8 stream; written at the start of `room` (at least
    `room_bytes`, on the host) where the native kernel runs, so a message's parts can lie back to back."""
    if (fast := native.encode_gaps(ids, room)) is not None:
        return fast
    gaps = _gaps(ids.view(-1))
    lengths = _lengths(gaps)
    starts = lengths.cumsum(0) - lengths
    out = torch.empty(int(lengths.sum()), dtype=torch.uint8, device=ids.device)
    for j in range(MAX_CODE):
        more = lengths > j
        if not bool(more.any()):
            break
        byte = ((gaps[more] >> (7 * j)) & 127) | ((lengths[more] > j + 1).long() << 7)
        out[starts[more] + j] = byte.to(torch.uint8)
    return out


def decode(codes: torch.Tensor, count: int, rows: int, dtype: torch.dtype) -> torch.Tensor:
    """The `count` ids of `encode`'s stream, as `dtype`; ZenCommError unless it is exactly `count` codes
    of ids below `rows` (a peer's message must not write outside the result)."""
    try:
        fast = native.decode_gaps(codes, count, rows, dtype)
    except RuntimeError as exc:
        raise ZenCommError(f"zen: malformed gap-coded ids: {exc}") from exc
    if fast is not None:
        return fast
    if count == 0 or codes.numel() == 0:
        if count or codes.numel():
            raise ZenCommError(f"zen: malformed gap-coded ids: {codes.numel()} bytes for {count} ids")
        return torch.empty(0, dtype=dtype, device=codes.device)
    b = codes.long()
    last = (b & 128) == 0
    if int(last.sum()) != count or not bool(last[-1]):
        raise ZenCommError(f"zen: malformed gap-coded ids: {int(last.sum())} codes where {count} were sent")
    first = torch.ones_like(last)
    first[1:] = last[:-1]
    starts = first.nonzero().view(-1)
    group = first.long().cumsum(0) - 1
    shift = torch.arange(b.numel(), device=b.device) - starts[group]
    if bool((shift >= MAX_CODE).any()):
        raise ZenCommError("zen: malformed gap-coded ids: a code longer than 64 bits")
    gaps = torch.zeros(count, dtype=torch.long, device=b.device).index_add_(0, group, (b & 127) << (7 * shift))
    ids = (gaps + 1).cumsum(0) - 1
    if bool((gaps < 0).any()) or int(ids[-1]) >= rows:
        raise ZenCommError(f"zen: malformed gap-coded ids: an id out of range (rows {rows})")
    return ids.to(dtype)


def nbytes(ids: torch.Tensor) -> int:
    """Length of `encode(ids)`, without building it."""
    return int(_lengths(_gaps(ids.view(-1))).sum()) if ids.numel() else 0


def bytes_per_id(density: float) -> float:
    """Expected code length of an id of a uniformly random row set of this density: its gap minus one is at
    least 128^j with probability (1 - density)^(128^j)."""
    q = min(max(1.0 - density, 0.0), 1.0)
    return 1.0 + sum(q ** (128**j) for j in range(1, MAX_CODE))
