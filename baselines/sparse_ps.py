"""Sparse parameter server (Parallax / BytePS style): Balanced Parallelism without the balance.

The row space [0, M) is cut into P even contiguous ranges R_j = [j M // P, (j+1) M // P), one server
per rank (zen.md section 2: "Sparse PS ... imbalanced (even ranges)"). Push: each rank sends its COO
rows of R_j to server j (all_to_all_v); server j sums them in rank order; pull: every server
all-gathers its aggregated COO rows (all_gather_v), so one owner sums each row and all ranks hold
bit-identical results. Skewed indices (frequent tokens have low ids) overload the first servers: the
cost is 2 (P-1)(d + d^P) s M / P with skew s, where Zen's hashing makes s ~ 1.

Bytes (s_i = index itemsize of `grad.index_dtype()`, s_v value itemsize, D row width, I_i rank i's
non-zero rows, U the rows whose sum is non-zero, i.e. the union of the I_i barring exact cancellation;
a row costs s_i + D s_v):
  push received by rank r: sum_{i != r} |I_i ∩ R_r| (s_i + D s_v);  sent: sum_{j != r} |I_r ∩ R_j| (...)
  pull received by rank r: sum_{j != r} |U ∩ R_j| (s_i + D s_v);    sent: (P-1) |U ∩ R_r| (...)
  meta: the headers and row counts of the push and the pull (zen.prediction's count_meta, gather_v_meta).
`predict` evaluates these on the index sets; `range_counts` and `owner_traffic` serve OmniReduce too.
"""

from __future__ import annotations

import torch

from zen.algorithms.partitions import even_bounds
from zen.comm.base import Communicator, Packed, count_meta, gather_v_meta
from zen.costmodel import Prediction, Sparsity
from zen.encodings import get_encoding
from zen.grad import LocalGrad
from zen.output import Output
from zen.registry import register_scheme
from zen.rows import add_messages, put_rows
from zen.types import PhaseBytes, SyncStats, WireLayout


def range_counts(ids: torch.Tensor, bounds: list[int]) -> list[int]:
    """How many of the ascending `ids` fall in each range [bounds[j], bounds[j+1])."""
    cuts = torch.searchsorted(ids, torch.tensor(bounds, dtype=ids.dtype, device=ids.device)).tolist()
    return [cuts[j + 1] - cuts[j] for j in range(len(bounds) - 1)]


def owner_traffic(push: list[list[int]], pull: list[int]) -> list[PhaseBytes]:
    """Bytes each rank receives when rank i pushes push[i][j] bytes to owner j (all_to_all_v) and owner j
    all-gathers pull[j] bytes (all_gather_v); both messages are two tensors, each preceded by its count."""
    P = len(pull)
    return [{"push": sum(push[i][r] for i in range(P) if i != r), "pull": sum(pull) - pull[r],
             "meta": count_meta(P) + gather_v_meta(P)} for r in range(P)]


@register_scheme("sparse_ps")
class SparseParameterServer:
    """Server j owns the contiguous row range R_j; push COO, sum once, pull COO."""

    sparse_input = True
    label, color, marker = "Sparse PS", "#8c564b", "P"  # how figures show it
    pulls = "COO, no hashing"

    def __call__(self, grad: LocalGrad, comm: Communicator, out: Output, stats: SyncStats) -> None:
        P, r = comm.world_size, comm.rank
        bounds = even_bounds(grad.num_rows, P)
        index, values = grad.rows()
        stats.nnz = int(index.numel())
        cuts = torch.searchsorted(index, torch.tensor(bounds, dtype=index.dtype, device=index.device))
        packed = Packed((index.to(grad.index_dtype()), values), cuts.diff())  # sizes read with the headers
        received = comm.all_to_all_v(packed, phase="push")
        stats.push_counts = packed.rows
        out.zero()
        add_messages(out.buffer, received)
        members = torch.arange(bounds[r], bounds[r + 1], device=grad.device)
        message, stats.server_count = get_encoding("coo").encode(out.buffer, members, grad.index_dtype())
        for j, (rows, vals) in enumerate(comm.all_gather_v(message, phase="pull")):
            if j != r:
                put_rows(out.buffer, rows, vals)

    def closed_form(self, w: Sparsity) -> Prediction:
        """Even contiguous ranges: the busiest server handles s times its share (spec: 2(n-1)(d+d^n)sM/n)."""
        share = (w.n - 1) / w.n
        return Prediction(share * w.skew * (1 + w.gamma(w.n)) * w.nnz * w.coo_row, 2 * (w.n - 1))

    def predict(self, sets: list[torch.Tensor], layout: WireLayout) -> list[PhaseBytes]:
        """The module's formulas on the index sets, U being their union (no exact cancellation)."""
        P = layout.world_size
        if P == 1:
            return [{}]
        bounds = even_bounds(layout.rows, P)
        union = torch.unique(torch.cat(sets))
        push = [[c * layout.coo_row for c in range_counts(s, bounds)] for s in sets]
        return owner_traffic(push, [c * layout.coo_row for c in range_counts(union, bounds)])
