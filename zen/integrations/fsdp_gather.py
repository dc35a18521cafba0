"""FSDP2's all-gather of parameters, sending only the rows that changed since the last all-gather.

FSDP gathers every parameter group dense before its forward (and again before its backward where it resharded
after the forward), although an optimizer step that applied a sparse gradient (an embedding's rows, a compressor's
choice, with plain SGD) changed only those rows. `DeltaAllGather` keeps the last gathered (unsharded) group on each
rank; each rank compares its shard with its copy in there, bit for bit, and sends its changed rows (int32 ids
within the shard and the rows) or, where that is no cheaper, its shard dense (zen.integrations.fsdp_plan's cost
model, no extra round), in one `all_gather_v` of the communicator (phase `gather`, every byte counted). Every rank
applies the same messages to the same copy, so the result is the bits FSDP's own all-gather would give. The cost:
one unsharded copy of each group per rank, the memory FSDP's sharding of parameters saves.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from zen.comm.base import code_of
from zen.core.synchronizer import ROW_BOUND_BYTES
from zen.device import Clock
from zen.integrations.fsdp_plan import INDEX, ChunkPlan, Runtime
from zen.types import SyncStats, ZenInputError

try:  # public from torch 2.14; torch 2.13 keeps the base class in the private module
    from torch.distributed.fsdp import AllGather
except ImportError:  # pragma: no cover - depends on the torch version
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather

GATHER = "gather"
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class DeltaAllGather(AllGather):
    """One parameter group's all-gather (see the module docstring); `width` elements per row as its
    reduce-scatter's."""

    def __init__(self, runtime: Runtime, key: str, group_name: str, width: int = 1):
        self.runtime, self.key, self.group_name, self.width = runtime, key, group_name, width
        self.copy: torch.Tensor | None = None  # the last gathered group, the same bits on every rank
        self.valid = False  # whether `copy` holds a whole gather's result
        self.mine: torch.Tensor | None = None  # our shard as it was last gathered

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """FSDP's output buffer is our copy itself: its copy-in writes only our shard there, the other shards stay
        as last gathered and take the changed rows in place (no copy of the group per call)."""
        numel = int(torch.Size(size).numel())
        if self.copy is None or self.copy.numel() != numel or self.copy.dtype != dtype or self.copy.device != device:
            self.copy, self.valid = torch.empty(numel, dtype=dtype, device=device), False
        return self.copy.view(*size)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 async_op: bool = False) -> Any:
        rt, comm = self.runtime, self.runtime.comm
        if group.group_name != self.group_name:
            raise ZenInputError(f"zen.fsdp: rank {comm.rank}, module {self.key!r}: all-gather over another process "
                                f"group ({group.group_name}) than its mesh's ({self.group_name})")
        stats, clock = SyncStats(), Clock(input_tensor.device).start()
        width = self.width if input_tensor.numel() % self.width == 0 else 1
        rows = input_tensor.view(-1, width)
        plan = ChunkPlan(rows.shape[0], width, input_tensor.element_size(), "zen")
        comm.begin_call(code_of(f"fsdp-gather|{width}|{input_tensor.numel()}|{input_tensor.dtype}"), sizes_agreed=True)
        comm.traffic = stats.traffic
        self.allocate(output_tensor.shape, dtype=output_tensor.dtype, device=output_tensor.device)  # our copy's size
        if not self.valid or self.mine is None or self.mine.shape != rows.shape:
            message = (torch.empty(0, dtype=INDEX, device=rows.device), rows)
            self.mine = rows.clone()
        else:
            message = self._changed(rows, plan)
        stats.nnz = int(message[0].shape[0])
        fits = comm.short_receives and (comm.world_size - 1) * plan.bound_bytes <= ROW_BOUND_BYTES
        got = comm.all_gather_v(message, GATHER, bound=plan.bound if fits else None)
        assert self.copy is not None
        chunks = self.copy.view(comm.world_size, -1, width)
        for j, (ids, values) in enumerate(got):
            if plan.is_dense((ids, values)):
                chunks[j].copy_(values)
            elif ids.shape[0]:
                chunks[j].index_copy_(0, ids.long(), values)
        self.valid = True
        if output_tensor.data_ptr() != self.copy.data_ptr():
            output_tensor.copy_(self.copy)
        return rt.finish(stats, False, clock.stop(), output_tensor, async_op)

    def _changed(self, rows: torch.Tensor, plan: ChunkPlan) -> tuple[torch.Tensor, torch.Tensor]:
        """Our rows whose bits differ from our shard as last gathered (which they replace there), or the shard
        dense."""
        assert self.mine is not None
        bits = _BITS[rows.element_size()]
        ids = (rows.view(bits) != self.mine.view(bits)).any(dim=1).nonzero().view(-1)
        if ids.shape[0] > plan.most_ids:
            self.mine.copy_(rows)
            return torch.empty(0, dtype=INDEX, device=rows.device), rows
        changed = rows.index_select(0, ids)
        self.mine.index_copy_(0, ids, changed)
        return ids.to(INDEX), changed
