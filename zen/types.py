"""Leaf types shared by the communicator, the schemes and the harness (no distributed calls here)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch

from zen import native
from zen.rows import add_messages, add_rows


class ZenError(RuntimeError):
    """Base class for errors the library raises on purpose."""


class ZenInputError(ValueError):
    """Bad input: raised on every rank, before any payload is exchanged."""


class ZenCommError(ZenError):
    """A collective failed: a dead or missing peer, or a timeout."""


@dataclass
class Traffic:
    """Exact payload bytes one rank sent and received, and collectives it joined, per phase."""

    sent: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    received: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def add(self, phase: str, sent: int, received: int) -> None:
        self.sent[phase] += int(sent)
        self.received[phase] += int(received)
        self.calls[phase] += 1

    @property
    def bytes_sent(self) -> int:
        return sum(self.sent.values())

    @property
    def bytes_received(self) -> int:
        return sum(self.received.values())


@dataclass
class SyncStats:
    """What one rank observed in one synchronization: traffic plus partition loads.

    `push_counts[j]` is the number of non-zero rows this rank sent to server j (its own included);
    `server_count` is the number of non-zero rows of the aggregated partition this rank served.
    Partition-free schemes leave both unset.
    """

    traffic: Traffic = field(default_factory=Traffic)
    nnz: int = 0
    push_counts: list[int] | None = None
    server_count: int | None = None
    choice: str | None = None
    extra: dict[str, float] = field(default_factory=dict)


@dataclass
class LocalGrad:
    """One rank's gradient seen as M rows of width D (D = 1 for a flattened dense tensor).

    Dense inputs keep `dense` (M, D); sparse COO inputs keep coalesced (`indices`, `values`).
    `rows()` extracts the non-zero rows once, ids ascending, and caches them, so schemes never scan twice.
    """

    num_rows: int
    row_width: int
    dtype: torch.dtype
    device: torch.device
    dense: torch.Tensor | None = None
    indices: torch.Tensor | None = None
    values: torch.Tensor | None = None
    bad_index: bool = False
    in_place: bool = False  # the output buffer is `dense` itself (set by zen.api.sync), as in DDP buckets
    divisor: int = 1  # the caller wants the sum divided by this (a DDP hook's mean; set by zen.api.sync)
    divided: bool = False  # a scheme's result write already divided it

    def rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.indices is None:
            assert self.dense is not None
            if (fast := native.nonzero_rows(self.dense)) is not None:
                self.indices, self.values = fast
            else:
                mask = self.dense != 0 if self.row_width == 1 else (self.dense != 0).any(dim=1)
                self.indices = mask.view(-1).nonzero().view(-1)
                self.values = self.dense.index_select(0, self.indices)
        assert self.values is not None
        return self.indices, self.values

    def zero_output(self, out: torch.Tensor) -> None:
        """out := 0. In place, `out` is the input, non-zero only at our rows: clearing those costs O(nnz),
        not a write of all M rows (a write as large as the dense gradient is most of a sparse sync's CPU time)."""
        if not self.in_place:
            out.zero_()
            return
        index, _ = self.rows()
        out.view(-1).index_fill_(0, index, 0)  # in place means a dense input: rows of width 1

    def own_output(self, out: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> None:
        """out := our rows (`index`, `values`) on zeros; free in place, where `out` holds them already.
        Zeros keep the sign they came in with there (a -0.0 stays -0.0; it equals 0.0)."""
        if not self.in_place:
            out.zero_()
            add_rows(out, index, values)  # == put_rows on zeros (0 + v is v for v != 0), and faster on CPU

    def write_result(self, out: torch.Tensor, sets: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """out := the sum of the (ids, values) row sets, added in list order; ids ascending within a set; in
        place `out` may hold, besides our input rows, rows of the sets (nothing else non-zero). The
        native pass streams the whole output out once without reading it: cheaper than zeroing it and
        scattering the rows, and even than scattering the rows alone (in place); it also divides by
        `divisor` on the way where it can (then `divided`), saving the caller a pass over the output."""
        if native.fill_sum(out, sets, self.divisor):
            self.divided = self.divisor != 1
            return
        self.zero_output(out)
        if self.in_place:  # a scheme may have summed rows of the sets into `out` already (BP's server)
            for index, _ in sets:
                out.view(-1).index_fill_(0, index.long(), 0)
        add_messages(out, sets)

    @property
    def nnz(self) -> int:
        return int(self.rows()[0].numel())

    def index_dtype(self) -> torch.dtype:
        """Wire dtype for row indices: int32 whenever it can hold every row id."""
        return torch.int32 if self.num_rows < 2**31 else torch.int64


@dataclass(frozen=True)
class WireLayout:
    """What a traffic prediction needs besides the index sets: sizes on the wire and the hash seed."""

    world_size: int
    rows: int
    width: int = 1
    value_bytes: int = 4
    index_bytes: int = 4
    seed: int = 0

    @property
    def coo_row(self) -> int:
        return self.index_bytes + self.width * self.value_bytes


PhaseBytes = dict[str, int]
