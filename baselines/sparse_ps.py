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
  meta: 16 (P-1) for the push row counts + 16 (P-1) for the pull row counts.
"""

from __future__ import annotations

import torch

from zen import encoding
from zen.comm.base import Communicator
from zen.registry import register_scheme
from zen.rows import add_rows, concat, put_rows
from zen.types import LocalGrad, SyncStats


def even_bounds(size: int, parts: int) -> list[int]:
    """Boundaries of `parts` even contiguous ranges of [0, size): range j is [b[j], b[j+1])."""
    return [j * size // parts for j in range(parts + 1)]


@register_scheme("sparse_ps")
class SparseParameterServer:
    """Server j owns the contiguous row range R_j; push COO, sum once, pull COO."""

    name = "sparse_ps"
    sparse_input = True

    def __call__(self, grad: LocalGrad, comm: Communicator, out: torch.Tensor, stats: SyncStats) -> None:
        P, r = comm.world_size, comm.rank
        bounds = even_bounds(grad.num_rows, P)
        index, values = grad.rows()
        cuts = torch.searchsorted(index, torch.tensor(bounds, device=index.device)).tolist()
        counts = [cuts[j + 1] - cuts[j] for j in range(P)]
        stats.nnz = int(index.numel())
        stats.push_counts = counts
        wire_index = index.to(grad.index_dtype())
        messages = list(zip(wire_index.split(counts), values.split(counts), strict=True))
        received = comm.all_to_all_v(messages, phase="push")
        out.zero_()
        add_rows(out, concat([m[0] for m in received]), concat([m[1] for m in received]))
        members = torch.arange(bounds[r], bounds[r + 1], device=out.device)
        message, stats.server_count = encoding.encode("coo", out, members, grad.index_dtype())
        for j, (rows, vals) in enumerate(comm.all_gather_v(message, phase="pull")):
            if j != r:
                put_rows(out, rows, vals)
