"""What zen.fsdp's reduce-scatter and all-gather share: the runtime of one sharded model, and the cost model of
their messages: per destination (a reduce-scatter's chunk, an all-gather's shard) its
non-zero or changed rows as COO (an int32 id within the chunk and the row) while that is cheaper than the chunk's
R rows dense, else the dense chunk, in the same message layout (no ids, R rows): the choice costs no extra round."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from zen.comm.base import Communicator, Message
from zen.compress.base import Compressor
from zen.ddp.hook import StepRecord
from zen.types import SyncStats

INDEX = torch.int32  # a row id within a chunk: FSDP's chunks stay far below 2**31 rows


@dataclass
class Runtime:
    """What every zen.fsdp collective of one sharded model shares: the communicator (its own process group), the
    compressor and its step counter, and the record of the last step's calls (a step: from one forward of the
    model to the next; `shard` hooks `next_step` in front of FSDP's own pre-forward)."""

    comm: Communicator
    scheme: str
    compressor: Compressor | None = None
    step: int = 0
    last_step: StepRecord = field(default_factory=StepRecord)

    def next_step(self, *_: object) -> None:
        """The model's forward begins: a new record, and the compressor's next step (after a step with calls)."""
        if self.last_step.parts:
            self.step += 1
            self.last_step = StepRecord()

    def finish(self, stats: SyncStats, sparse: bool, span: float, output: torch.Tensor, async_op: bool) -> Any:
        """One collective done: its record in the step's, and what FSDP expects back (a completed Work when it
        asked for one: the call ran to its end, on the caller's stream)."""
        self.last_step.parts.append((stats, sparse))
        self.last_step.spans.append(span)
        if not async_op:
            return None
        done: torch.futures.Future = torch.futures.Future()
        done.set_result([output])
        return torch._C._distributed_c10d._create_work_from_future(done)


@dataclass(frozen=True)
class ChunkPlan:
    """The cost model of one call, per destination: its rows as COO (int32 id + the row) while that is cheaper
    than its dense chunk of R rows, else the chunk. A dense message carries no ids and R rows."""

    R: int
    width: int
    value_bytes: int
    scheme: str

    @property
    def most_ids(self) -> int:
        """The most rows a COO message can have (one more and the dense chunk is no dearer)."""
        if self.scheme == "dense":
            return 0
        row = self.width * self.value_bytes
        return min(self.R, max(0, math.ceil(self.R * row / (INDEX.itemsize + row)) - 1))

    def bound(self, _rank: int) -> list[int]:
        return [self.most_ids, self.R]

    @property
    def bound_bytes(self) -> int:
        return self.most_ids * INDEX.itemsize + self.R * self.width * self.value_bytes

    def is_dense(self, m: Message) -> bool:
        return m[0].shape[0] == 0 and m[1].shape[0] == self.R and self.R > 0

    def message(self, chunks: torch.Tensor, ids: torch.Tensor, values: torch.Tensor, cuts: list[int], j: int
                ) -> Message:
        a, b = cuts[j], cuts[j + 1]
        return self.built(chunks, ids, values, [0, 0, a, b - a], j)

    def counts(self, cuts: torch.Tensor) -> torch.Tensor:
        """(P, 4) on the device: per destination the ids and rows to send, and where its rows start and how many."""
        k = cuts[1:] - cuts[:-1]
        dense = k > self.most_ids if self.scheme != "dense" else torch.ones_like(k, dtype=torch.bool)
        ids = torch.where(dense, torch.zeros_like(k), k)
        rows = torch.where(dense, torch.full_like(k, self.R), k)
        return torch.stack([ids, rows, cuts[:-1], k], dim=1)

    def built(self, chunks: torch.Tensor, ids: torch.Tensor, values: torch.Tensor, row: list[int], j: int
              ) -> Message:
        """Destination j's message from its (ids, rows, start, k) numbers (`counts`'s row, or made on the host)."""
        start, k = row[2], row[3]
        if k > self.most_ids or self.scheme == "dense":
            return ids[:0].to(INDEX), chunks[j]
        return (ids[start : start + k] - j * self.R).to(INDEX), values[start : start + k]
