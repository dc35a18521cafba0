"""The `zen` scheme: run Balanced Parallelism while measuring gamma, then let the cost model pick
BP or Hierarchical Centralization (paper section 5, Theorem 1) for each tensor size.

The default rule is the paper's: bytes received only. Local work is left out on purpose: both schemes
make the same dense passes (extract the non-zeros, write the output once), and the rest of their work
is linear in the rows they exchange (BP: hash, sort the received ids, decode the hash bitmaps; HC: one
sequential merge of two sorted unions per round, see zen/hc.py), so the bytes track it. A positive
alpha adds a per-message latency, which favours HC's fewer messages.
"""

from __future__ import annotations

import torch

from zen import costmodel
from zen.bp import BalancedParallelism
from zen.comm.base import Communicator
from zen.grad import LocalGrad
from zen.hc import HierarchicalCentralization
from zen.output import Output
from zen.registry import register_scheme
from zen.types import PhaseBytes, SyncStats, WireLayout


@register_scheme("zen")
class ZenAuto:
    """Measures d_G and gamma^n during the first `measure_iters` calls per tensor size (as BP),
    then keeps the choice. Every rank decides from the same all-gathered numbers. With the default
    alpha = 0 this is the paper's bytes-only rule; a positive alpha also weighs message counts."""

    name = "zen"
    sparse_input = True

    def __init__(self, measure_iters: int = 1, alpha: float = 0.0, bandwidth_gbps: float = 25.0,
                 choice: str | None = None, **bp_options: object):
        if choice not in (None, "bp", "hc"):
            raise ValueError(f"choice must be 'bp', 'hc' or None (auto), got {choice!r}")
        self.bp = BalancedParallelism(**bp_options)
        self.hc = HierarchicalCentralization()
        self.measure_iters = max(1, measure_iters)
        self.net = costmodel.Network(alpha=alpha, bandwidth=bandwidth_gbps * 1e9 / 8)
        self.forced = choice
        self.seen: dict[tuple, int] = {}
        self.choices: dict[tuple, str] = {}

    def __call__(self, grad: LocalGrad, comm: Communicator, out: Output, stats: SyncStats) -> None:
        key = (grad.num_rows, grad.row_width, grad.dtype)
        choice = self.forced or self.choices.get(key)
        if choice == "hc":
            stats.choice = "hc"
            self.hc(grad, comm, out, stats)
            return
        self.bp(grad, comm, out, stats)
        stats.choice = "bp"
        if choice is None:
            self.seen[key] = self.seen.get(key, 0) + 1
            if self.seen[key] >= self.measure_iters:
                self.choices[key] = self._decide(grad, comm, stats)

    def _decide(self, grad: LocalGrad, comm: Communicator, stats: SyncStats) -> str:
        mine = torch.tensor([stats.nnz, stats.server_count or 0], dtype=torch.int64, device=comm.device)
        table = comm.all_gather_fixed(mine).cpu()
        layout = WireLayout(comm.world_size, grad.num_rows, grad.row_width, grad.dtype.itemsize,
                            grad.index_dtype().itemsize)
        mean_nnz = float(table[:, 0].double().mean())
        union = int(table[:, 1].sum())
        stats.extra["gamma_n"] = union / mean_nnz if mean_nnz else 1.0
        return self.decide(layout, mean_nnz, union)

    def decide(self, layout: WireLayout, mean_nnz: float, union: int) -> str:
        """BP or HC from the measured mean non-zero rows per rank and the union size."""
        if mean_nnz == 0:
            return "bp"
        n = layout.world_size
        workload = costmodel.Workload(
            n=n, rows=layout.rows, density=mean_nnz / layout.rows,
            gamma=costmodel.gamma_from_union(n, union / mean_nnz), width=layout.width,
            value_bytes=layout.value_bytes, index_bytes=layout.index_bytes,
        )
        return costmodel.choose_bp_or_hc(workload, self.net, self.bp.pull)

    def predict(self, sets: list[torch.Tensor], layout: WireLayout) -> list[PhaseBytes]:
        """Steady state: the path the selector picks from these sets' statistics."""
        mean_nnz = sum(int(s.numel()) for s in sets) / len(sets)
        union = int(torch.unique(torch.cat(sets)).numel())
        choice = self.forced or self.decide(layout, mean_nnz, union)
        return (self.bp if choice == "bp" else self.hc).predict(sets, layout)
