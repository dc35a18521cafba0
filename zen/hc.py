"""Hierarchical Centralization (paper section 5.2): recursive doubling over sparse COO aggregates.

Round i exchanges the whole aggregate of a block of 2^(i-1) ranks with the partner block, so rank r
receives gamma^(2^(i-1)) * M * d_G rows. World sizes that are not a power of two fold the first
2 * (P - p') ranks in pairs before the rounds and unfold after them (zen.fold). Each step adds exactly two
partial sums, which commutes, so partners end with bit-identical results.
"""

from __future__ import annotations

import torch

from zen.comm.base import Communicator
from zen.fold import Fold
from zen.grad import LocalGrad
from zen.output import Output
from zen.prediction import message_meta
from zen.registry import register_scheme
from zen.rows import merge_rows
from zen.types import PhaseBytes, SyncStats, WireLayout


@register_scheme("zen-hc")
class HierarchicalCentralization:
    """Rank r keeps its running union as (ids, sums) with ascending ids: our rows come ascending
    (LocalGrad.rows()), every message is such a union, and a merge of two is one sequential pass
    (rows.merge_rows). The dense output is written once, at the end, in address order, summing the last
    round's two unions on the way. Rows whose sums cancel to exactly zero stay in the union, so every
    rank's union is the union of the index sets."""

    sparse_input = True

    def __call__(self, grad: LocalGrad, comm: Communicator, out: Output, stats: SyncStats) -> None:
        index, values = grad.rows()
        stats.nnz = int(index.numel())
        idx_dtype = grad.index_dtype()
        fold, r = Fold(comm.world_size), comm.rank
        like = (index[:0].to(idx_dtype), values[:0])
        if grad.dense is None:  # sparse inputs may hold -0.0; send +0.0 like every sum
            values = values + 0.0
        union = (index.to(idx_dtype), values)
        if fold.sits_out(r):  # hand data to the odd neighbour, wait for the sum
            comm.sendrecv(fold.partner(r), union, None, phase="fold")
            out.write([comm.sendrecv(fold.partner(r), None, like, phase="unfold")])
            return
        folded = fold.folded(r)
        if folded:
            union = merge_rows(union, comm.sendrecv(fold.partner(r), None, like, phase="fold"))
        vrank = fold.vrank(r)
        result = [union]  # row sets whose sum is the result
        for level in range(fold.levels):
            got = comm.sendrecv(fold.peer(vrank, level), union, like, phase="reduce")
            result = [union, got]  # the last round is summed straight into `out`, never merged
            if level + 1 < fold.levels or folded:
                union = merge_rows(union, got)
                result = [union]
        if folded:
            comm.sendrecv(fold.partner(r), union, None, phase="unfold")
        out.write(result)

    def predict(self, sets: list[torch.Tensor], layout: WireLayout) -> list[PhaseBytes]:
        """Replays the rounds on row masks: each receive is the sender's current union."""
        fold = Fold(layout.world_size)
        cur = []
        for s in sets:
            mask = torch.zeros(layout.rows, dtype=torch.bool)
            mask[s] = True
            cur.append(mask)
        got: list[PhaseBytes] = [{} for _ in range(layout.world_size)]

        def receive(r: int, phase: str, sender: torch.Tensor) -> None:
            got[r][phase] = got[r].get(phase, 0) + int(sender.sum()) * layout.coo_row
            got[r]["meta"] = got[r].get("meta", 0) + message_meta(2)  # header, row counts of (ids, values)

        for sitter, holder in fold.pairs:
            receive(holder, "fold", cur[sitter])
            cur[holder] = cur[holder] | cur[sitter]
        active = fold.active
        for level in range(fold.levels):
            partners = [fold.peer(v, level) for v in range(fold.p2)]
            for r, peer in zip(active, partners, strict=True):
                receive(r, "reduce", cur[peer])
            merged = [cur[r] | cur[peer] for r, peer in zip(active, partners, strict=True)]
            for r, mask in zip(active, merged, strict=True):
                cur[r] = mask
        for sitter, holder in fold.pairs:
            receive(sitter, "unfold", cur[holder])
        return got
