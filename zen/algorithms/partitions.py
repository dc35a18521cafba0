"""Which server owns a row in Balanced Parallelism: Algorithm 1's hash partitions, or equal contiguous ranges.

Hashing balances skewed non-zeros (frequent rows spread over every server), which is what BP is for. Once the
ranks' union is near-dense there is no skew left to balance, and the hash partitions' statistical spread (a
binomial count of non-zero rows per server) makes the busiest server's pull longer than equal ranges would:
`RangePartitions` gives server j the rows [j M // n, (j + 1) M // n), and BP keeps everything else (push as
COO, one sum per row at its server in rank order, the same pull encodings over S_j). Both answer the same
questions, so BP's code does not know which it has.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Protocol

import torch

from zen import native
from zen.device import accelerated
from zen.hashing import (
    HashFamily,
    ServerRanks,
    hierarchical_hash,
    membership_words,
    ranks_in,
    server_bits,
    server_ranks,
    server_rows,
)
from zen.rows import take_rows

Grouped = tuple[torch.Tensor, torch.Tensor, list[int] | torch.Tensor, int]  # wire ids, rows, counts, serial
PARTITIONS = ("hash", "range")


class Partitioner(Protocol):
    """What BP asks of its partitions: S_j (ascending members, with offsets), as membership words and as a
    row -> position lookup, the owner of given ids, and a rank's rows grouped by owner for the push."""

    def owners(self, ids: torch.Tensor, n: int, num_rows: int) -> torch.Tensor: ...

    def server_rows(self, num_rows: int, n: int, device: torch.device) -> tuple[torch.Tensor, tuple[int, ...]]: ...

    def server_bits(self, num_rows: int, n: int, device: torch.device) -> torch.Tensor: ...

    def server_ranks(self, num_rows: int, n: int, device: torch.device, server: int) -> ServerRanks: ...

    def group(self, index: torch.Tensor, values: torch.Tensor, n: int, index_dtype: torch.dtype,
              num_rows: int) -> Grouped: ...


def even_bounds(size: int, parts: int) -> list[int]:
    """Boundaries of `parts` even contiguous ranges of [0, size): range j is [b[j], b[j+1])."""
    return [j * size // parts for j in range(parts + 1)]


class HashPartitions:
    """S_j = the rows with h0 = j (paper section 3), from the communicator's shared seed."""

    def __init__(self, family: HashFamily, r1_factor: float, r2_ratio: float) -> None:
        self.family, self.r1_factor, self.r2_ratio = family, r1_factor, r2_ratio

    def owners(self, ids: torch.Tensor, n: int, num_rows: int) -> torch.Tensor:
        return self.family.h0(ids, n)

    def server_rows(self, num_rows: int, n: int, device: torch.device) -> tuple[torch.Tensor, tuple[int, ...]]:
        return server_rows(num_rows, n, self.family, device)

    def server_bits(self, num_rows: int, n: int, device: torch.device) -> torch.Tensor:
        return server_bits(num_rows, n, self.family, device)

    def server_ranks(self, num_rows: int, n: int, device: torch.device, server: int) -> ServerRanks:
        return server_ranks(num_rows, n, self.family, device, server)

    def group(self, index: torch.Tensor, values: torch.Tensor, n: int, index_dtype: torch.dtype,
              num_rows: int) -> Grouped:
        """(wire ids, their rows, rows per server, rows that missed the k probes or -1) grouped by server. On
        the CPU one stable counting sort by h0 (native partition_rows): Algorithm 1's partitions without its
        slot claims, which only order a partition and let thousands of GPU threads write without a sort."""
        if (grouped := native.partition_rows(index, values, n, self.family, index_dtype)) is not None:
            return *grouped, -1
        parts = hierarchical_hash(index, n, self.family, self.r1_factor, self.r2_ratio)
        return (index.index_select(0, parts.order).to(index_dtype), take_rows(values, parts.order), parts.counts,
                parts.serial)


@lru_cache(maxsize=16)
def _range_rows(num_rows: int, n: int, device: str) -> tuple[torch.Tensor, tuple[int, ...]]:
    dtype = torch.int32 if num_rows < 2**31 else torch.int64
    return torch.arange(num_rows, dtype=dtype, device=device), tuple(even_bounds(num_rows, n))


@lru_cache(maxsize=4)
def _range_bits(num_rows: int, n: int, device: str) -> torch.Tensor:
    return membership_words(*_range_rows(num_rows, n, device), num_rows)


@lru_cache(maxsize=16)
def _range_ranks(num_rows: int, n: int, device: str, server: int) -> ServerRanks:
    members, bounds = _range_rows(num_rows, n, device)
    return ranks_in(members[bounds[server] : bounds[server + 1]], num_rows)


class RangePartitions:
    """S_j = [j M // n, (j + 1) M // n): a rank's ascending rows are already grouped by server (no reorder,
    only the cuts), and no seed is needed."""

    def owners(self, ids: torch.Tensor, n: int, num_rows: int) -> torch.Tensor:
        """Server of every id: the last j with j M // n <= id."""
        bounds = torch.tensor(even_bounds(num_rows, n), dtype=torch.int64, device=ids.device)
        return torch.searchsorted(bounds, ids.to(torch.int64), right=True) - 1

    def server_rows(self, num_rows: int, n: int, device: torch.device) -> tuple[torch.Tensor, tuple[int, ...]]:
        return _range_rows(num_rows, n, str(device))

    def server_bits(self, num_rows: int, n: int, device: torch.device) -> torch.Tensor:
        return _range_bits(num_rows, n, str(device))

    def server_ranks(self, num_rows: int, n: int, device: torch.device, server: int) -> ServerRanks:
        return _range_ranks(num_rows, n, str(device), server)

    def group(self, index: torch.Tensor, values: torch.Tensor, n: int, index_dtype: torch.dtype,
              num_rows: int) -> Grouped:
        """The ascending rows cut at the ranges' bounds (counts on the device for an accelerator)."""
        bounds = torch.tensor(even_bounds(num_rows, n), dtype=index.dtype, device=index.device)
        counts = torch.searchsorted(index, bounds).diff()
        return index.to(index_dtype), values, counts if accelerated(index.device) else counts.tolist(), -1
