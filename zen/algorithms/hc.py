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
from zen.comm.base import Communicator, Message, message_meta
from zen.comm.pool import after
from zen.costmodel import Prediction, Sparsity
from zen.device import accelerated
from zen.fold import Fold
from zen.grad import LocalGrad
from zen.output import Output
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
    label = "Zen HC"
    color = "#e377c2"
    marker = "X"
    IDS = ("coo", "gaps")

    def __init__(self, ids: str = "coo") -> None:
        if ids not in self.IDS:
            raise ValueError(f"ids must be one of {self.IDS}, got {ids!r}")
        self.ids = ids

    def _coded(self, like: Message) -> bool:
        """Ids gap-coded on the wire: with `ids="gaps"` on the host (an accelerator sends COO ids, since a code
        stream's length is known only after a host read)."""
        return self.ids == "gaps" and not accelerated(like[1].device)

    def _round(self, comm: Communicator, to: int | None, send: Message | None, source: int | None,
               wire: tuple[Message, int], phase: str, merged: bool = False,
               reach: list[int] | None = None) -> Message | None:
        """One round every rank joins (`Communicator.exchange`): send `send` to rank `to` and/or receive from
        rank `source` ((ids, values) messages). Coded, the values go first, so that they start aligned in the
        receive buffer (a view of it, not a copy); a `merged` union (`_merge`'s, with room after its values)
        gets its codes written right behind its values, and the message goes out without a copy. `reach`:
        the most rows each rank's union can hold now (`_reaches`), which bounds its message. `wire`: the call's
        (ids, values) template and M, the rows an id may name."""
        like, rows = wire
        coded = self._coded(like)
        wire_like = (like[1], like[0][:0].to(torch.uint8)) if coded else like
        if to is not None and send is not None and coded:
            room = after(send[1], gaps.room_bytes(int(send[0].shape[0]), send[0].dtype)) if merged else None
            send = (send[1], gaps.encode(send[0], room))

        def bound(j: int) -> list[int]:
            assert reach is not None
            return [reach[j], gaps.room_bytes(reach[j], like[0].dtype) if coded else reach[j]]

        got = comm.exchange({to: send} if to is not None and send is not None else {},
                            {source: wire_like} if source is not None else {}, phase,
                            bound if reach is not None else None)
        if source is None:
            return None
        message = got[source]
        if not coded:
            return message
        return gaps.decode(message[1], int(message[0].shape[0]), rows, like[0].dtype), message[0]

    def _merge(self, comm: Communicator, a: Message, b: Message) -> Message:
        """The union of two row sets; on the host written into room from the communicator's pool (a fresh union
        every call faulted in 200-650 pages on some ranks, half again the merge's own time), with room for its
        gap codes after its values where they are coded. An accelerator's merge is torch ops, whose caching
        allocator already reuses memory."""
        if accelerated(a[1].device):
            return merge_rows((a[0], a[1]), (b[0], b[1]))
        rows = int(a[0].shape[0]) + int(b[0].shape[0])
        spare = gaps.room_bytes(rows, a[0].dtype) if self._coded(a) else 0
        room = comm.pool.take_rows(rows, a[0].dtype, a[1], spare)
        return merge_rows((a[0], a[1]), (b[0], b[1]), room)

    @staticmethod
    def _reaches(fold: Fold, rows: list[int] | None, num_rows: int) -> list[list[int] | None]:
        """Before each round (the fold, every level, the unfold): the most rows each rank's union can hold, the
        sum of the announced rows (`Communicator.announced`) of the ranks it covers, at most the tensor's
        `num_rows`; Nones without them."""
        if rows is None:
            return [None] * (fold.levels + 2)
        cur, out = list(rows), [list(rows)]
        for sitter, holder in fold.pairs:
            cur[holder] = min(cur[holder] + cur[sitter], num_rows)
        for level in range(fold.levels):
            out.append(list(cur))
            grown = list(cur)
            for v, r in enumerate(fold.active):
                grown[r] = min(cur[r] + cur[fold.peer(v, level)], num_rows)
            cur = grown
        return [*out, cur]

    def __call__(self, grad: LocalGrad, comm: Communicator, out: Output, stats: SyncStats) -> None:
        index, values = grad.rows()
        stats.nnz = int(index.numel())
        idx_dtype = grad.index_dtype()
        fold, r, M = Fold(comm.world_size), comm.rank, grad.num_rows
        reaches = self._reaches(fold, comm.announced(grad), grad.num_rows)
        like = (index[:0].to(idx_dtype), values[:0])
        if grad.dense is None:  # sparse inputs may hold -0.0; send +0.0 like every sum
            values = values + 0.0
        union = (index.to(idx_dtype), values)
        merged = False  # whether `union` is _merge's, with room for its codes
        sits_out, folded = fold.sits_out(r), fold.folded(r)
        partner = fold.partner(r) if folded else None
        if fold.extra:  # the even rank of each folded pair hands its rows to the odd one
            got = self._round(comm, partner if sits_out else None, union, None if sits_out else partner, (like, M),
                              "fold", reach=reaches[0])
            if got is not None:
                union, merged = self._merge(comm, union, got), True
        result = [union]  # row sets whose sum is the result
        for level in range(fold.levels):  # sitters join every round with nothing to say
            peer = None if sits_out else fold.peer(fold.vrank(r), level)
            got = self._round(comm, peer, union, peer, (like, M), "reduce", merged, reaches[1 + level])
            if got is None:
                continue
            result = [union, got]  # the last round is summed straight into `out`, never merged
            if level + 1 < fold.levels or folded:
                union, merged = self._merge(comm, union, got), True
                result = [union]
        if fold.extra:
            got = self._round(comm, None if sits_out else partner, union, partner if sits_out else None, (like, M),
                              "unfold", merged, reaches[-1])
            if got is not None:
                result = [got]
        out.write(result)

    def closed_form(self, w: Sparsity, code_scale: float = 1.0) -> Prediction:
        """sum_i gamma^(2^(i-1)) M d_G rows, plus fold/unfold; each row costs s_i + D s_v as COO, or with
        `ids="gaps"` the expected gap code of a set of that union's density (section 5), times `code_scale`
        (what the ranks' own codes measured over what random sets of their density would take: clustered
        rows code shorter)."""
        fold = Fold(w.n)
        unions = [w.gamma(1 << i) for i in range(fold.levels)]
        messages = fold.levels
        if fold.extra:  # folded ranks add one hop in and one out (a rank sees at most one of them)
            unions.append(w.gamma(w.n))
            messages += 1

        def row_bytes(gamma: float) -> float:
            if self.ids == "coo":
                return w.coo_row
            return code_scale * gaps.bytes_per_id(min(1.0, gamma * w.density)) + w.width * w.value_bytes

        return Prediction(sum(g * w.nnz * row_bytes(g) for g in unions), messages)

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
            got[r]["meta"] = got[r].get("meta", 0) + message_meta()  # header, row counts of (ids, values)

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
