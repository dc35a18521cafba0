"""Hierarchical Centralization (paper section 5.2): recursive doubling over sparse COO aggregates.

Round i exchanges the whole aggregate of a block of 2^(i-1) ranks with the partner block, so rank r
receives gamma^(2^(i-1)) * M * d_G rows. World sizes that are not a power of two fold the first
2 * (P - p') ranks in pairs before the rounds and unfold after them. Each step adds exactly two
partial sums, which commutes, so partners end with bit-identical results.
"""

from __future__ import annotations

import torch

from zen.comm.base import Communicator
from zen.encoding import nonzero_rows
from zen.prediction import COUNT_BYTES
from zen.registry import register_scheme
from zen.rows import add_rows, put_rows, take_rows
from zen.types import LocalGrad, PhaseBytes, SyncStats, WireLayout


class _Union:
    """A rank's union of row ids and its running sums: in `out` (rows outside the union are zero) and,
    through the first merge, also compactly in `values`, equal to out[rows] bit for bit. Our own rows are
    ascending until then (LocalGrad.rows()), so the first merge patches the few rows it shares with the
    sender by binary search, and the next round sends without gathering the union from `out`."""

    def __init__(self, rows: torch.Tensor, values: torch.Tensor):
        self.rows = rows  # distinct wire-dtype ids; each non-zero in `out` unless listed in `cancelled`
        self.cancelled = rows[~nonzero_rows(values)]  # sparse COO inputs may carry zero rows
        self.values: torch.Tensor | None = values
        self.merges = 0

    def merge(self, out: torch.Tensor, got_idx: torch.Tensor, got_val: torch.Tensor) -> None:
        """out[got] += got_val (one add per row, which commutes, so partners agree bit for bit) and
        append the received ids that were new to the union."""
        old = take_rows(out, got_idx)
        add_rows(out, got_idx, got_val)  # index_add_: on CPU much cheaper than index_copy_ of the sums
        total = old + got_val  # what `out` now holds at got_idx
        fresh = ~nonzero_rows(old)
        if self.cancelled.numel():
            fresh &= ~torch.isin(got_idx, self.cancelled)
        if self.merges == 0 and self.values is not None:
            shared = ~fresh
            values = self.values.clone()
            values[torch.searchsorted(self.rows, got_idx[shared])] = total[shared]
            self.values = torch.cat([values, _select_rows(got_val, fresh)])  # 0 + v is v: v is never -0.0
        else:
            self.values = None
        self.rows = torch.cat([self.rows, torch.masked_select(got_idx, fresh)])
        self.merges += 1
        zero = ~nonzero_rows(total)
        if bool(zero.any()):  # exact cancellation: in the union, yet zero in `out`
            self.cancelled = torch.cat([self.cancelled, got_idx[zero]])

    def aggregate(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, sums) of the union, to send to the next partner."""
        return self.rows, self.values if self.values is not None else take_rows(out, self.rows)


def _select_rows(block: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if block.shape[1] == 1:
        return torch.masked_select(block.view(-1), mask).view(-1, 1)
    return block[mask]


def fold_layout(world_size: int) -> tuple[int, int]:
    """(p', extra): the largest power of two <= P, and how many ranks sit out."""
    p2 = 1 << (world_size.bit_length() - 1)
    return p2, world_size - p2


@register_scheme("zen-hc")
class HierarchicalCentralization:
    """Rank r keeps its running union of row ids in a `_Union` (distinct, in arrival order; the order on
    the wire is free since receivers add distinct rows). A merge finds the ids it lacked from `out`
    itself: every row of the union is non-zero there except exact cancellations, which are tracked
    apart, so a merge costs O(rows received) and touches only rows it adds to (no sort of the union)."""

    name = "zen-hc"
    sparse_input = True

    def __call__(self, grad: LocalGrad, comm: Communicator, out: torch.Tensor, stats: SyncStats) -> None:
        index, values = grad.rows()
        stats.nnz = int(index.numel())
        idx_dtype = grad.index_dtype()
        P, r = comm.world_size, comm.rank
        p2, extra = fold_layout(P)
        like = (index[:0].to(idx_dtype), values[:0])
        if grad.dense is None:  # sparse inputs may hold -0.0; send +0.0 like every sum in `out`
            values = values + 0.0
        own = (index.to(idx_dtype), values)
        if r < 2 * extra and r % 2 == 0:  # sits out: hand data to the odd neighbour, wait for the sum
            comm.sendrecv(r + 1, own, None, phase="fold")
            got_idx, got_val = comm.sendrecv(r + 1, None, like, phase="unfold")
            out.zero_()
            put_rows(out, got_idx, got_val)
            stats.extra["union_rows"] = float(got_idx.numel())
            return
        out.zero_()
        add_rows(out, *own)  # == put_rows on zeros (0 + v is v), and faster on CPU
        union = _Union(*own)
        if r < 2 * extra:
            union.merge(out, *comm.sendrecv(r - 1, None, like, phase="fold"))
        vrank = r // 2 if r < 2 * extra else r - extra
        for level in range(p2.bit_length() - 1):
            vpeer = vrank ^ (1 << level)
            peer = 2 * vpeer + 1 if vpeer < extra else vpeer + extra
            union.merge(out, *comm.sendrecv(peer, union.aggregate(out), like, phase="reduce"))
            stats.extra[f"union_rows_{2 << level}"] = float(union.rows.numel())
        if r < 2 * extra:
            comm.sendrecv(r - 1, union.aggregate(out), None, phase="unfold")
        stats.extra["union_rows"] = float(union.rows.numel())

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
