"""Hierarchical Centralization (paper section 5.2): recursive doubling over sparse COO aggregates.

Round i exchanges the whole aggregate of a block of 2^(i-1) ranks with the partner block, so rank r
receives gamma^(2^(i-1)) * M * d_G rows. World sizes that are not a power of two fold the first
2 * (P - p') ranks in pairs before the rounds and unfold after them (zen.fold). Each step adds exactly two
partial sums, which commutes, so partners end with bit-identical results. `ids="gaps"` sends each message's
ids gap-coded (zen.gaps) instead of as plain COO indices: the same sums, fewer bytes where rows are narrow.
"""

from __future__ import annotations

import torch

from zen import gaps
from zen.comm.base import Communicator, Message
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
    IDS = ("coo", "gaps")

    def __init__(self, ids: str = "coo") -> None:
        if ids not in self.IDS:
            raise ValueError(f"ids must be one of {self.IDS}, got {ids!r}")
        self.ids = ids

    def _sendrecv(self, comm: Communicator, peer: int, send: Message | None, like: Message | None, phase: str,
                  rows: int) -> Message | None:
        """comm.sendrecv of (ids, values) messages, the ids gap-coded on the wire with `ids="gaps"`."""
        if self.ids == "coo":
            return comm.sendrecv(peer, send, like, phase)
        coded = (gaps.encode(send[0]), send[1]) if send is not None else None
        wire_like = (like[0][:0].to(torch.uint8), like[1]) if like is not None else None
        got = comm.sendrecv(peer, coded, wire_like, phase)
        if got is None or like is None:
            return None
        return gaps.decode(got[0], int(got[1].shape[0]), rows, like[0].dtype), got[1]

    def __call__(self, grad: LocalGrad, comm: Communicator, out: Output, stats: SyncStats) -> None:
        index, values = grad.rows()
        stats.nnz = int(index.numel())
        idx_dtype = grad.index_dtype()
        fold, r, M = Fold(comm.world_size), comm.rank, grad.num_rows
        like = (index[:0].to(idx_dtype), values[:0])
        if grad.dense is None:  # sparse inputs may hold -0.0; send +0.0 like every sum
            values = values + 0.0
        union = (index.to(idx_dtype), values)
        if fold.sits_out(r):  # hand data to the odd neighbour, wait for the sum
            self._sendrecv(comm, fold.partner(r), union, None, "fold", M)
            out.write([self._sendrecv(comm, fold.partner(r), None, like, "unfold", M)])
            return
        folded = fold.folded(r)
        if folded:
            union = merge_rows(union, self._sendrecv(comm, fold.partner(r), None, like, "fold", M))
        vrank = fold.vrank(r)
        result = [union]  # row sets whose sum is the result
        for level in range(fold.levels):
            got = self._sendrecv(comm, fold.peer(vrank, level), union, like, "reduce", M)
            result = [union, got]  # the last round is summed straight into `out`, never merged
            if level + 1 < fold.levels or folded:
                union = merge_rows(union, got)
                result = [union]
        if folded:
            self._sendrecv(comm, fold.partner(r), union, None, "unfold", M)
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
            count = int(sender.sum())
            ids = gaps.nbytes(sender.nonzero().view(-1)) if self.ids == "gaps" else count * layout.index_bytes
            got[r][phase] = got[r].get(phase, 0) + ids + count * layout.width * layout.value_bytes
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
