"""What travels: a message's layout and bytes, its header's size, and the metadata a rank receives beside
the payload (what every `predict` adds).

Byte conventions (what a rank sends to and receives from the others, never from itself), added to `traffic`
under the caller's phase:
- exchange / all_to_all_v / all_gather_v: exact payload bytes; headers under "meta" (HEAD_BYTES per
  message and peer; an all_gather_v's header is one fixed all-gather). A backend whose all-gather needs
  equal sizes (NCCL) pads every rank's message to the largest: the padding is counted under "pad".
- all_gather_fixed: (world_size - 1) * FIXED_SLOTS * 8 each way (phase "meta" unless given;
  shared_seed's under "setup").
- all_reduce / all_reduce_async: the ring algorithm's payload, 2 * (numel - own chunk) * itemsize each
  way (the async one counts when it is issued), plus a fixed all-gather of the size under "meta" when the
  call's sizes were not agreed beforehand.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from zen.comm.pool import BufferPool, span

Message = tuple[torch.Tensor, ...]
META = "meta"
PAD = "pad"
MAX_TENSORS = 5  # tensors per message: their row counts ride in the header
HEAD_SLOTS = 3 + MAX_TENSORS  # a message's header, per peer: call, code, layout, row counts (int64)
HEAD_BYTES = 8 * HEAD_SLOTS
FIXED_SLOTS = 16  # a fixed all-gather: call, code, length, up to 13 values
FIXED_VALUES = FIXED_SLOTS - 3
FIXED_BYTES = 8 * FIXED_SLOTS  # one rank's part of a fixed all-gather


def code_of(text: str) -> int:
    """A stable 32-bit code of a description (dtypes and shapes, a scheme and its options)."""
    return zlib.crc32(text.encode())


def layout_code(template: Message) -> int:
    """What sender and receiver must agree on about a message: its tensors' dtypes and row shapes."""
    return code_of(";".join(f"{t.dtype}{tuple(t.shape[1:])}" for t in template))


def ring_chunk(numel: int, world_size: int, rank: int) -> int:
    """Size of `rank`'s chunk when a ring all-reduce cuts `numel` elements into `world_size` pieces."""
    base, rem = divmod(numel, world_size)
    return base + (1 if rank < rem else 0)


def row_bytes(template: Message) -> list[int]:
    """Bytes of one row (first-dim slice) of each tensor of a message."""
    return [t.element_size() * math.prod(t.shape[1:]) for t in template]


def message_bytes(counts: Sequence[int], widths: Sequence[int]) -> int:
    return sum(int(c) * b for c, b in zip(counts, widths, strict=True))


def offsets(counts: Sequence[int]) -> list[int]:
    bounds = [0]
    for c in counts:
        bounds.append(bounds[-1] + int(c))
    return bounds


def on_lines(nbytes: int) -> int:
    """`nbytes` rounded up to whole 64-byte lines."""
    return -(-nbytes // 64) * 64


def check_template(template: Message) -> None:
    if not 1 <= len(template) <= MAX_TENSORS:
        raise ValueError(f"a message holds 1 to {MAX_TENSORS} tensors, got {len(template)}")


def bytes_of(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.uint8)


def pack(messages: Sequence[Message], device: torch.device, pool: BufferPool) -> torch.Tensor:
    """Messages back to back as one byte buffer on `device` taken from `pool` (one copy of each tensor, none of a
    lone tensor already there, nor of tensors already back to back in one buffer)."""
    flat = [bytes_of(t) for m in messages for t in m if t.numel()]
    if flat and flat[0].device == device and (whole := flat[0] if len(flat) == 1 else span(flat)) is not None:
        return whole  # parts written back to back (HC's union and its codes) go as they lie
    buf = pool.take(sum(t.numel() for t in flat), device)
    offset = 0
    for t in flat:
        buf[offset : offset + t.numel()].copy_(t)
        offset += t.numel()
    return buf


def unpack(buf: torch.Tensor, counts: Sequence[int], template: Message) -> Message:
    """A message rebuilt from its bytes, shaped and typed like `template`, on the template's device (views of
    `buf` where the alignment allows)."""
    out, offset = [], 0
    for count, like, width in zip(counts, template, row_bytes(template), strict=True):
        nbytes = int(count) * width
        chunk = buf[offset : offset + nbytes].to(like.device)
        if chunk.storage_offset() % like.element_size():
            chunk = chunk.clone()
        out.append(chunk.view(like.dtype).view(int(count), *like.shape[1:]))
        offset += nbytes
    return tuple(out)


@dataclass
class Packed:
    """A message to every rank, laid out back to back: tensor t holds rank 0's rows, then rank 1's, ...;
    `counts` (rows per destination, on the host or still on the device) says how many. Saves a scheme from
    reading its partition sizes before the header round does (BP's hashed partitions): after the round,
    `rows` holds them on the host."""

    tensors: Message
    counts: torch.Tensor | Sequence[int]
    rows: list[int] | None = None


@dataclass
class Deferred:
    """Messages to `peers` (default: every other rank) whose sizes are still on the device, built only once
    the header round has read them: `counts` is (P, C), its first len(template) columns the rows of each
    tensor per destination (they go in the headers), any further columns read with them but not sent.
    `build(rows)`, rows[j] those C numbers for rank j on the host, returns the P messages (our own at our
    rank; others ignored for non-peers). Saves a scheme a host read of its cut points before the round:
    afterwards `rows` holds them."""

    template: Message
    counts: torch.Tensor
    build: Callable[[list[list[int]]], list[Message]]
    peers: Sequence[int] | None = None
    rows: list[list[int]] | None = None


# ---- metadata a rank receives (what `predict`s add to a scheme's payload) ------------------------


def message_meta() -> int:
    """Metadata of one message received from one peer: its header (call, code, layout, row counts)."""
    return HEAD_BYTES


def count_meta(world_size: int) -> int:
    """Metadata received in an all_to_all_v (one message per peer)."""
    return (world_size - 1) * message_meta()


def gather_meta(world_size: int) -> int:
    """What one fixed all-gather brings (the input check, a scheme's small agreement)."""
    return (world_size - 1) * FIXED_BYTES


def gather_v_meta(world_size: int) -> int:
    """Metadata received in an all_gather_v: its fixed all-gather of layouts and row counts."""
    return (world_size - 1) * FIXED_BYTES
