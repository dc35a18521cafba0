"""Host byte buffers kept from call to call, so a steady-state call faults in no fresh pages for its wire.

glibc gives heap memory back to the kernel once the free top of its heap passes a trim threshold (twice the
largest block it has mmapped and freed, a few MB here). A call that allocates and frees a few MB of send and
receive buffers then meets fresh pages every time, and faulting them in is a visible share of a call's CPU
(scripts/stage_times.py counts them; the numbers are in BENCHMARKS.md). A pooled buffer is handed out again only
when no tensor views it any more (its storage's use count), so a received message a caller keeps (a sparse
result that is one received row set) is never overwritten. Device buffers come from torch's caching allocator,
which already reuses them in stream order; the pool serves host buffers only. One thread at a time, as a
communicator's calls are.
"""

from __future__ import annotations

import math

import torch

MIN_BYTES = 1 << 16  # smaller buffers come from malloc's bins, which keep their pages
MAX_BUFFERS = 8  # more live buffers than a call has at once: the rest are allocated as usual
MAX_BYTES = 256 << 20  # what the pool may hold: larger traffic (dense-ish buckets) is allocated as usual


def _use_count(t: torch.Tensor) -> int:
    """References to `t`'s storage (tensors and views of it, plus the one this call makes)."""
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


def _idle_count() -> int | None:
    """A pooled buffer's use count when nothing but the pool holds it; None where torch cannot tell (no pooling)."""
    try:
        return _use_count(torch.empty(1, dtype=torch.uint8))
    except (AttributeError, RuntimeError):
        return None


IDLE = _idle_count()


def capacity(nbytes: int) -> int:
    """`nbytes` rounded up to an eighth of its power of two (at most 12.5% more), so the next call's slightly
    larger message still fits."""
    step = max(1, (1 << (nbytes.bit_length() - 1)) >> 3)
    return -(-nbytes // step) * step


class BufferPool:
    """Host byte buffers for one communicator's messages: `take(n)` is a fresh-looking n-byte tensor."""

    def __init__(self) -> None:
        self._buffers: list[torch.Tensor] = []

    def take(self, nbytes: int, device: torch.device) -> torch.Tensor:
        """`nbytes` uninitialised bytes on `device`: a view of an idle pooled buffer on the host, else new."""
        if device.type != "cpu" or nbytes < MIN_BYTES or IDLE is None:
            return torch.empty(nbytes, dtype=torch.uint8, device=device)
        idle = [b for b in self._buffers if _use_count(b) == IDLE]
        fits = [b for b in idle if b.numel() >= nbytes]
        if fits:
            return min(fits, key=torch.Tensor.numel)[:nbytes]
        if idle:  # the largest idle one is too small: replace it
            largest = max(idle, key=torch.Tensor.numel)
            self._buffers = [b for b in self._buffers if b is not largest]
        buf = torch.empty(capacity(nbytes), dtype=torch.uint8)
        if len(self._buffers) < MAX_BUFFERS and self.nbytes + buf.numel() <= MAX_BYTES:
            self._buffers.append(buf)
        return buf[:nbytes]

    def take_rows(self, rows: int, index_dtype: torch.dtype, like: torch.Tensor, spare: int = 0
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """Room for a row set of `rows` rows: (ids of `index_dtype`, values shaped (rows, *like.shape[1:]) of
        like's dtype), in one buffer on like's device (HC's unions, merged every call), with `spare` bytes more
        after the values: what `after` hands out past a set of at most `rows` rows written there."""
        width = math.prod(like.shape[1:])
        ids_bytes = -(-rows * index_dtype.itemsize // 64) * 64  # values start on a 64-byte line
        values_bytes = rows * width * like.element_size()
        buf = self.take(ids_bytes + values_bytes + spare, like.device)
        ids = buf[: rows * index_dtype.itemsize].view(index_dtype)
        return ids, buf[ids_bytes : ids_bytes + values_bytes].view(like.dtype).view(rows, *like.shape[1:])

    @property
    def nbytes(self) -> int:
        """Bytes the pool holds."""
        return sum(b.numel() for b in self._buffers)


def after(t: torch.Tensor, nbytes: int) -> torch.Tensor:
    """The `nbytes` bytes of t's storage right after contiguous `t`, as uint8: where a message's next part is
    written so that its parts lie back to back (`pack` then sends them without a copy). Only for room the
    caller owns there (take_rows' `spare`)."""
    start = (t.storage_offset() + t.numel()) * t.element_size()
    storage = t.untyped_storage()
    if not t.is_contiguous() or start + nbytes > storage.nbytes():
        raise ValueError(f"after: {nbytes} bytes past a tensor leave its storage of {storage.nbytes()} bytes")
    return _bytes_at(t, start, nbytes)


def _bytes_at(t: torch.Tensor, start: int, nbytes: int) -> torch.Tensor:
    """Bytes [start, start + nbytes) of t's storage as a uint8 tensor viewing it."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage(), start, (nbytes,))


def span(parts: list[torch.Tensor]) -> torch.Tensor | None:
    """The uint8 tensors `parts`, back to back in one storage, as one uint8 view; None if they are not."""
    first = parts[0]
    storage = first.untyped_storage()
    end = first.data_ptr() + first.numel()
    for p in parts[1:]:
        if p.device != first.device or p.untyped_storage().data_ptr() != storage.data_ptr() or p.data_ptr() != end:
            return None
        end += p.numel()
    return _bytes_at(first, first.storage_offset(), end - first.data_ptr())
