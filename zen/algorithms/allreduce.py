"""Dense AllReduce: what DDP does by default; the reference every sparse scheme is measured against.

Bytes received per rank: 2 (P-1)/P * M * s_v (ring)."""

from __future__ import annotations

import torch

from zen.comm.base import Communicator, ring_chunk
from zen.costmodel import Prediction, Sparsity
from zen.grad import LocalGrad
from zen.output import Output
from zen.registry import register_scheme
from zen.rows import put_rows
from zen.types import PhaseBytes, SyncStats, WireLayout


@register_scheme("allreduce")
class DenseAllReduce:
    sparse_input = False
    label = "AllReduce"
    color = "#4d4d4d"
    marker = "s"

    def __call__(self, grad: LocalGrad, comm: Communicator, out: Output, stats: SyncStats) -> None:
        buffer = out.buffer
        if grad.dense is not None:
            if grad.dense.data_ptr() != buffer.data_ptr():
                buffer.copy_(grad.dense)
        else:
            index, values = grad.rows()
            out.zero()
            put_rows(buffer, index, values)
        comm.all_reduce(buffer, phase="allreduce")

    def closed_form(self, w: Sparsity) -> Prediction:
        return Prediction(2 * (w.n - 1) / w.n * w.rows * w.width * w.value_bytes, 2 * (w.n - 1))

    def predict(self, sets: list[torch.Tensor], layout: WireLayout) -> list[PhaseBytes]:
        P, numel = layout.world_size, layout.rows * layout.width
        if P == 1:
            return [{}]
        return [{"allreduce": 2 * (numel - ring_chunk(numel, P, r)) * layout.value_bytes} for r in range(P)]
