"""Hierarchical Centralization without its merge: every rank's rows reach every rank in one all-gather, and
every rank sums them in rank order.

HC's rounds save bytes only where the ranks' rows overlap (a union smaller than the sum of its parts); where
they barely do, its log2(P) rounds carry the same rows as one all-gather would, and its merges (a pass over the
growing union per round) are pure cost. This plan is that all-gather, with HC's id encodings: plain COO ids,
or gap-coded ones (zen.gaps) on the host.
"""

from __future__ import annotations

import torch

from zen import gaps
from zen.comm.base import Communicator, gather_v_meta
from zen.costmodel import Prediction, Sparsity
from zen.device import accelerated
from zen.grad import LocalGrad
from zen.output import Output
from zen.registry import register_scheme
from zen.types import PhaseBytes, SyncStats, WireLayout

IDS = ("coo", "gaps")


@register_scheme("zen-ag")
class GatherRows:
    """One `all_gather_v` of (ids, values); the result is the sum of the P row sets in rank order, the same
    float operations on every rank."""

    sparse_input = True
    label = "Zen AG"
    color = "#f7b6d2"
    marker = "D"

    def __init__(self, ids: str = "coo") -> None:
        if ids not in IDS:
            raise ValueError(f"ids must be one of {IDS}, got {ids!r}")
        self.ids = ids

    def __call__(self, grad: LocalGrad, comm: Communicator, out: Output, stats: SyncStats) -> None:
        index, values = grad.rows()
        stats.nnz = int(index.numel())
        idx_dtype = grad.index_dtype()
        if grad.dense is None:  # sparse inputs may hold -0.0; send +0.0 like every sum
            values = values + 0.0
        coded = self.ids == "gaps" and not accelerated(values.device)
        announced = comm.announced(grad)

        def bound(j: int) -> list[int]:
            assert announced is not None
            rows = announced[j]
            return [rows, gaps.room_bytes(rows, idx_dtype)] if coded else [rows, rows]

        # coded, the values go first so that they land aligned in the receive buffer (views, not copies)
        message = (values, gaps.encode(index.to(idx_dtype))) if coded else (index.to(idx_dtype), values)
        got = comm.all_gather_v(message, phase="gather", bound=bound if announced is not None else None)
        if coded:
            got = [(gaps.decode(codes, int(vals.shape[0]), grad.num_rows, idx_dtype), vals) for vals, codes in got]
        out.write(got)

    def closed_form(self, w: Sparsity) -> Prediction:
        """(n-1) k rows, each s_i + D s_v as COO, or the expected gap code of a set of density d_G."""
        row = w.coo_row if self.ids == "coo" else gaps.bytes_per_id(min(1.0, w.density)) + w.width * w.value_bytes
        return Prediction((w.n - 1) * w.nnz * row, w.n - 1)

    def predict(self, sets: list[torch.Tensor], layout: WireLayout) -> list[PhaseBytes]:
        """Each rank receives every other rank's rows (its codes counted exactly) and the gather's counts."""
        P = layout.world_size
        if P == 1:
            return [{}]
        value_bytes = layout.width * layout.value_bytes
        sizes = [int(s.numel()) * value_bytes + (gaps.nbytes(s) if self.ids == "gaps" else
                                                 int(s.numel()) * layout.index_bytes) for s in sets]
        total = sum(sizes)
        return [{"gather": total - own, "meta": gather_v_meta(P)} for own in sizes]
