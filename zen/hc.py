"""Hierarchical Centralization (paper section 5.2): recursive doubling over sparse COO aggregates.

Round i exchanges the whole aggregate of a block of 2^(i-1) ranks with the partner block, so rank r
receives gamma^(2^(i-1)) * M * d_G rows. World sizes that are not a power of two fold the first
2 * (P - p') ranks in pairs before the rounds and unfold after them. Each step adds exactly two
partial sums, which commutes, so partners end with bit-identical results.
"""

from __future__ import annotations

import torch

from zen.comm.base import Communicator
from zen.grad import LocalGrad
from zen.output import Output
from zen.prediction import COUNT_BYTES
from zen.registry import register_scheme
from zen.rows import merge_rows
from zen.types import PhaseBytes, SyncStats, WireLayout


def fold_layout(world_size: int) -> tuple[int, int]:
    """(p', extra): the largest power of two <= P, and how many ranks sit out."""
    p2 = 1 << (world_size.bit_length() - 1)
    return p2, world_size - p2


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
        P, r = comm.world_size, comm.rank
        p2, extra = fold_layout(P)
        like = (index[:0].to(idx_dtype), values[:0])
        if grad.dense is None:  # sparse inputs may hold -0.0; send +0.0 like every sum
            values = values + 0.0
        union = (index.to(idx_dtype), values)
        if r < 2 * extra and r % 2 == 0:  # sits out: hand data to the odd neighbour, wait for the sum
            comm.sendrecv(r + 1, union, None, phase="fold")
            out.write([comm.sendrecv(r + 1, None, like, phase="unfold")])
            return
        if r < 2 * extra:
            union = merge_rows(union, comm.sendrecv(r - 1, None, like, phase="fold"))
        vrank = r // 2 if r < 2 * extra else r - extra
        rounds = p2.bit_length() - 1
        result = [union]  # row sets whose sum is the result
        for level in range(rounds):
            vpeer = vrank ^ (1 << level)
            peer = 2 * vpeer + 1 if vpeer < extra else vpeer + extra
            got = comm.sendrecv(peer, union, like, phase="reduce")
            result = [union, got]  # the last round is summed straight into `out`, never merged
            if level + 1 < rounds or r < 2 * extra:
                union = merge_rows(union, got)
                result = [union]
        if r < 2 * extra:
            comm.sendrecv(r - 1, union, None, phase="unfold")
        out.write(result)

    def predict(self, sets: list[torch.Tensor], layout: WireLayout) -> list[PhaseBytes]:
        """Replays the rounds on row masks: each receive is the sender's current union."""
        P = layout.world_size
        p2, extra = fold_layout(P)
        cur = []
        for s in sets:
            mask = torch.zeros(layout.rows, dtype=torch.bool)
            mask[s] = True
            cur.append(mask)
        got: list[PhaseBytes] = [{} for _ in range(P)]

        def receive(r: int, phase: str, sender: torch.Tensor) -> None:
            got[r][phase] = got[r].get(phase, 0) + int(sender.sum()) * layout.coo_row
            got[r]["meta"] = got[r].get("meta", 0) + 2 * COUNT_BYTES  # row counts of (ids, values)

        for r in range(1, 2 * extra, 2):
            receive(r, "fold", cur[r - 1])
            cur[r] = cur[r] | cur[r - 1]
        active = [2 * v + 1 if v < extra else v + extra for v in range(p2)]
        for level in range(p2.bit_length() - 1):
            partners = [active[v ^ (1 << level)] for v in range(p2)]
            for r, peer in zip(active, partners, strict=True):
                receive(r, "reduce", cur[peer])
            merged = [cur[r] | cur[peer] for r, peer in zip(active, partners, strict=True)]
            for r, mask in zip(active, merged, strict=True):
                cur[r] = mask
        for r in range(0, 2 * extra, 2):
            receive(r, "unfold", cur[r + 1])
        return got
