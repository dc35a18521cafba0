"""Dense AllReduce: what DDP does by default; the reference every sparse scheme is measured against.

Bytes received per rank: 2 (P-1)/P * M * s_v (ring)."""

from __future__ import annotations

import torch

from zen.comm.base import Communicator, ring_chunk
from zen.registry import register_scheme
from zen.rows import put_rows
from zen.types import LocalGrad, PhaseBytes, SyncStats, WireLayout


@register_scheme("allreduce")
class DenseAllReduce:
    name = "allreduce"
    sparse_input = False

    def __call__(self, grad: LocalGrad, comm: Communicator, out: torch.Tensor, stats: SyncStats) -> None:
        if grad.dense is not None:
            if grad.dense.data_ptr() != out.data_ptr():
                out.copy_(grad.dense)
        else:
            index, values = grad.rows()
            out.zero_()
            put_rows(out, index, values)
        comm.all_reduce(out, phase="allreduce")

    def predict(self, sets: list[torch.Tensor], layout: WireLayout) -> list[PhaseBytes]:
        P, numel = layout.world_size, layout.rows * layout.width
        if P == 1:
            return [{}]
        return [{"allreduce": 2 * (numel - ring_chunk(numel, P, r)) * layout.value_bytes} for r in range(P)]
