"""A rank's own work in a plan, priced: what `zen`'s prediction (zen.algorithms.plans) adds to the bytes' time.

Bytes decide where the link is slow; where it is fast, the passes a plan makes over its rows decide between plans
that move about the same bytes (HC's merges and rounds against one all-gather, BP's hash grouping against equal
ranges' cuts). Every such pass (a merge, a gap decode, a partition's decode, a sum into the result) is a sequential
walk over rows, so one cost model covers them: seconds per row walked, per byte of those rows' values, and per
step (a kernel called, or a message posted: a call and its bookkeeping). The constants are
measured on this machine by timing `zen.rows.merge_rows` (`measure`) and kept as JSON (`load`, `save`): the same
numbers on every rank, so every rank makes the same choice.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from zen.types import Measured

DEFAULT = Path(__file__).with_name("local_cost.json")
ROWS = (1 << 14, 1 << 17)  # two merge sizes: the difference gives the cost per row
WIDE = 16  # a wider row at the small size: the cost per value byte


@dataclass(frozen=True)
class LocalCost(Measured):
    """row_s: seconds per row walked; byte_s: per byte of the walked rows' values; step_s: per round, partition
    or message handled. The default (all zero) prices bytes only."""

    row_s: float = 0.0
    byte_s: float = 0.0
    step_s: float = 0.0
    source: str = ""

    def seconds(self, rows: float, value_bytes: float, steps: float) -> float:
        """The time of walking `rows` rows of `value_bytes` bytes in all, in `steps` steps."""
        return rows * self.row_s + value_bytes * self.byte_s + steps * self.step_s

    @classmethod
    def default(cls) -> LocalCost:
        """The constants the package keeps (measured where the library was calibrated)."""
        return cls.load(DEFAULT)


def merge_seconds(rows: int, width: int, repeats: int, clock: Callable[[], float] = time.perf_counter) -> float:
    """Median seconds of `zen.rows.merge_rows` on two random ascending sets of `rows` rows each out of 2 `rows`
    (about half shared) into a reused buffer, after one merge untimed; `clock` reads the time (a thread's CPU
    time where other processes must not stretch it)."""
    from zen.rows import merge_rows

    g = torch.Generator().manual_seed(rows + width)
    a, b = ((torch.randperm(2 * rows, generator=g)[:rows].sort().values.to(torch.int32),
             torch.randn(rows, width, generator=g)) for _ in range(2))
    room = torch.empty(2 * rows, dtype=torch.int32), torch.empty(2 * rows, width)
    times = []
    for _ in range(repeats + 1):
        start = clock()
        merge_rows(a, b, room)
        times.append(clock() - start)
    return statistics.median(times[1:])


def measure(repeats: int = 21) -> LocalCost:
    """The constants from `zen.rows.merge_rows` here: a merge of two sets of 1 row each is a step, the growth from
    ROWS[0] to ROWS[1] rows a set the cost of an input row (its union written too), and WIDE rows' extra time at
    ROWS[0] the cost of an input value byte."""
    small, big = ROWS
    step = merge_seconds(1, 1, repeats)
    narrow, wide = merge_seconds(small, 1, repeats), merge_seconds(small, WIDE, repeats)
    grown = merge_seconds(big, 1, repeats)
    row = max(0.0, (grown - narrow) / (2 * (big - small)))
    byte = max(0.0, (wide - narrow) / (2 * small * (WIDE - 1) * 4))
    return LocalCost(row, byte, step, f"merge_rows here ({torch.get_num_threads()} threads), median of {repeats}: "
                                      f"1 row {step:.2e} s, {small} rows {narrow:.2e} s, {big} rows {grown:.2e} s, "
                                      f"{small} rows of {WIDE} values {wide:.2e} s")
