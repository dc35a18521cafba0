"""AGsparse: all-gather every rank's COO rows and sum them locally (Horovod / GRACE / gloo sparse).

Handles ranks with no non-zeros (gloo's own sparse all-reduce does not). Bytes received per rank:
sum over the other ranks of k_j * (s_i + D * s_v); it grows with P and ignores overlap. Every rank
adds the contributions in rank order, so all ranks hold identical results."""

from __future__ import annotations

import torch

from zen.comm.base import Communicator, gather_v_meta
from zen.costmodel import Prediction, Sparsity
from zen.grad import LocalGrad
from zen.output import Output
from zen.registry import register_scheme
from zen.types import PhaseBytes, SyncStats, WireLayout


@register_scheme("agsparse")
class AllGatherSparse:
    sparse_input = True
    label, color, marker = "AGsparse", "#1f77b4", "v"  # how figures show it

    def __call__(self, grad: LocalGrad, comm: Communicator, out: Output, stats: SyncStats) -> None:
        """One all-gather; where the input check announced every rank's row count, its header rides in front
        of the payload (one round, as Zen's exchanges do), else it is a fixed all-gather first."""
        index, values = grad.rows()
        stats.nnz = int(index.numel())
        announced = comm.announced(grad)
        bound = None if announced is None else lambda j: [announced[j], announced[j]]
        gathered = comm.all_gather_v((index.to(grad.index_dtype()), values), phase="gather", bound=bound)
        out.write(gathered)

    def closed_form(self, w: Sparsity) -> Prediction:
        """(n-1) k (s_i + D s_v), blind to overlap."""
        return Prediction((w.n - 1) * w.nnz * w.coo_row, w.n - 1)

    def predict(self, sets: list[torch.Tensor], layout: WireLayout) -> list[PhaseBytes]:
        P = layout.world_size
        if P == 1:
            return [{}]
        total = sum(int(s.numel()) for s in sets)
        return [{"gather": (total - int(s.numel())) * layout.coo_row, "meta": gather_v_meta(P)} for s in sets]
