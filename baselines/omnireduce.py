"""OmniReduce (Fei et al., SIGCOMM'21) with colocated aggregators, as a byte-faithful emulation.

Format: the flattened (M, D) tensor of N = M D elements is cut into B = ceil(N / b) blocks of
b = `block_size` elements (block x holds len(x) = min(b, N - x b) elements: the last may be partial);
a block goes on the wire iff it holds a non-zero (threshold 0: lossless). Aggregator j, colocated
on rank j, owns the contiguous block range R_j = [j B // P, (j+1) B // P). Push: all_to_all_v of
every rank's non-zero blocks to their owners; the owner sums them in rank order. Pull: all_gather_v
of the union of the blocks the owner received, so each block is summed once and all ranks hold
bit-identical results.

A column message (worker -> aggregator in push, aggregator -> all in pull) with block ids
x_1 < ... < x_k is (offset words [x_1, ..., x_k, end] as int32 (int64 if B >= 2^31), the blocks'
elements). Block t thus carries a 4-byte offset, x_{t+1}: the id of the sender's next non-zero
block in that column (end = the upper bound of R_j after the last); the leading word announces the
first block, which OmniReduce does by sending each column's first block unconditionally.

Bytes (s_v value itemsize; K_i rank i's non-zero blocks; U the union of the K_i):
  msg(K) = 4 (|K| + 1) [K non-empty] + s_v sum_{x in K} len(x)
  push received by rank r: sum_{i != r} msg(K_i ∩ R_r);  sent: sum_{j != r} msg(K_r ∩ R_j)
  pull received by rank r: sum_{j != r} msg(U ∩ R_j);    sent: (P-1) msg(U ∩ R_r)
  meta: the headers and row counts of the push and the pull (zen.prediction's count_meta, gather_v_meta).

Faithful: bytes (b s_v per block plus one 4-byte next-offset per block, as OmniReduce's packets
carry), block granularity (one non-zero ships its whole block: at density d a block is sent with
probability 1 - (1-d)^b) and aggregator load imbalance under skew (even block ranges, so the rank
owning the hot low indices receives and serves the most blocks).
Not faithful: RDMA streaming and pipelining (here two bulk-synchronous collectives, no overlap of
push and pull, no min-next-offset flow control), per-column streams (OmniReduce interleaves many
columns per aggregator and sends each column's first block even if zero; here one column per
(worker, aggregator) pair, announced by one 4-byte word), and dedicated aggregator hosts (only the
colocated deployment). `stats.push_counts` and `stats.server_count` count blocks, not rows.
`predict` evaluates the byte formulas on row sets, taking every element of a non-zero row as non-zero.
"""

from __future__ import annotations

from itertools import accumulate

import torch

from baselines.sparse_ps import even_bounds, owner_traffic, range_counts
from zen.comm.base import Communicator, Deferred
from zen.costmodel import Prediction, Sparsity
from zen.grad import LocalGrad
from zen.output import Output
from zen.registry import register_scheme
from zen.rows import concat
from zen.types import PhaseBytes, SyncStats, WireLayout


def block_id_dtype(num_blocks: int) -> torch.dtype:
    """Dtype of the offset words: int32 whenever it can hold every block id and the end bound."""
    return torch.int32 if num_blocks < 2**31 else torch.int64


@register_scheme("omnireduce")
class OmniReduce:
    """Aggregator j owns the contiguous block range R_j; push non-zero blocks, sum once, pull the union."""

    sparse_input = True
    label, color, marker = "OmniReduce", "#9467bd", "D"  # how figures show it
    pulls = "tensor blocks"  # how its pull is shown beside the encodings (Fig 17)

    def __init__(self, block_size: int = 256):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size

    def __call__(self, grad: LocalGrad, comm: Communicator, out: Output, stats: SyncStats) -> None:
        P, r = comm.world_size, comm.rank
        flat = out.buffer.view(-1)
        num_blocks = -(-flat.numel() // self.block_size)
        bounds = even_bounds(num_blocks, P)
        id_dtype = block_id_dtype(num_blocks)
        index, values = grad.rows()
        stats.nnz = int(index.numel())
        blocks = self._nonzero_blocks(index, values != 0)
        out.own(index, values)
        cuts = torch.searchsorted(blocks, torch.tensor(bounds, dtype=blocks.dtype, device=blocks.device))
        count = cuts.diff()
        tail = torch.zeros_like(count)  # the partial last block (if any) is in the last column: its deficit
        deficit = num_blocks * self.block_size - flat.numel()
        if deficit:
            tail[-1] = (blocks[-1:] == num_blocks - 1).sum() * deficit
        sizes = torch.stack([count + (count > 0), count * self.block_size - tail], 1)  # words, elements

        def columns(rows: list[list[int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
            starts = list(accumulate((max(words - 1, 0) for words, _ in rows), initial=0))
            return [self._column(flat, blocks[starts[j] : starts[j + 1]], bounds[j + 1], id_dtype,
                                 elements != max(words - 1, 0) * self.block_size)
                    for j, (words, elements) in enumerate(rows)]

        template = (blocks[:0].to(id_dtype), flat[:0])
        push = Deferred(template, sizes, columns)
        received = comm.all_to_all_v(push, phase="push")
        assert push.rows is not None
        stats.push_counts = [max(words - 1, 0) for words, _ in push.rows]
        out.zero()
        ids = [words[:-1] for words, _ in received]
        for x, (_, payload) in zip(ids, received, strict=True):  # in rank order, as add_messages sums
            self._write_blocks(flat, x, payload, add=True)
        union = torch.unique(concat(ids))
        stats.server_count = int(union.numel())
        partial = any(p.numel() != x.numel() * self.block_size for x, (_, p) in zip(ids, received, strict=True))
        mine = self._column(flat, union, bounds[r + 1], id_dtype, partial)
        for j, (words, payload) in enumerate(comm.all_gather_v(mine, phase="pull")):
            if j != r:
                self._write_blocks(flat, words[:-1], payload, add=False)

    def closed_form(self, w: Sparsity) -> Prediction:
        """Blocks of `block_size` elements, 4 bytes of next-offset per block; non-empty block fractions from
        uniform placement: 1 - (1 - d)^b per worker, 1 - (1 - d^n)^b for the union."""
        block = self.block_size
        d, dn = w.density, min(1.0, w.gamma(w.n) * w.density)
        blocks = w.rows * w.width / block
        per_block = block * w.value_bytes + 4
        own = (1 - (1 - d) ** (block / w.width)) * blocks
        union = (1 - (1 - dn) ** (block / w.width)) * blocks
        share = (w.n - 1) / w.n
        return Prediction(share * w.skew * (own + union) * per_block, 2 * (w.n - 1))

    def predict(self, sets: list[torch.Tensor], layout: WireLayout) -> list[PhaseBytes]:
        """The module's formulas, with K_i the blocks the rows of set i cover and U their union."""
        P = layout.world_size
        if P == 1:
            return [{}]
        numel = layout.rows * layout.width
        bounds = even_bounds(-(-numel // self.block_size), P)
        blocks = [self._nonzero_blocks(s, torch.ones(1, 1, dtype=torch.bool).expand(len(s), layout.width))
                  for s in sets]
        union = torch.unique(torch.cat(blocks))
        push = [self._column_bytes(k, bounds, numel, layout.value_bytes) for k in blocks]
        return owner_traffic(push, self._column_bytes(union, bounds, numel, layout.value_bytes))

    def _column_bytes(self, ids: torch.Tensor, bounds: list[int], numel: int, value_bytes: int) -> list[int]:
        """msg(K ∩ R_j) for each owner j, K the ascending block ids `ids` (the sizes `_column` produces)."""
        word = block_id_dtype(bounds[-1]).itemsize
        sizes = [(c + 1) * word + c * self.block_size * value_bytes if c else 0 for c in range_counts(ids, bounds)]
        if ids.numel() and int(ids[-1]) == bounds[-1] - 1:  # the last block is cut at numel
            sizes[-1] -= (bounds[-1] * self.block_size - numel) * value_bytes
        return sizes

    def _nonzero_blocks(self, index: torch.Tensor, nonzero: torch.Tensor) -> torch.Tensor:
        """Ascending ids of the blocks holding a non-zero element, `nonzero` (k, D) marking them within the
        rows `index` (rows come sorted, so ids do too)."""
        width = nonzero.shape[1]
        columns = torch.arange(width, device=index.device)
        elements = (index.unsqueeze(1) * width + columns)[nonzero]
        return torch.unique_consecutive(elements // self.block_size)

    def _take_blocks(self, flat: torch.Tensor, ids: torch.Tensor, partial: bool) -> torch.Tensor:
        """The elements of the ascending blocks `ids`, whole-block gathers; `partial`: the last id is the
        partial last block (the caller knows it from sizes on the host)."""
        b = self.block_size
        full = flat.numel() // b
        taken = flat[: full * b].view(full, b).index_select(0, (ids[:-1] if partial else ids).long()).view(-1)
        return torch.cat([taken, flat[full * b :]]) if partial else taken

    def _write_blocks(self, flat: torch.Tensor, ids: torch.Tensor, payload: torch.Tensor, add: bool) -> None:
        """flat[blocks ids] += payload (add) or = payload; the payload's length says whether the partial last
        block is among them (no host read of the ids)."""
        b = self.block_size
        full = flat.numel() // b
        rows = flat[: full * b].view(full, b)
        partial = payload.numel() != ids.numel() * b
        k = (ids.numel() - partial) * b
        full_ids = (ids[:-1] if partial else ids).long()
        body = payload[:k].view(-1, b)
        if add:
            rows.index_add_(0, full_ids, body)
        else:
            rows.index_copy_(0, full_ids, body)
        if partial and add:
            flat[rows.numel() :] += payload[k:]
        elif partial:
            flat[rows.numel() :] = payload[k:]

    def _column(self, flat: torch.Tensor, ids: torch.Tensor, end: int, id_dtype: torch.dtype, partial: bool
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Wire message of one column: offset words [ids..., end] (none if empty) and the blocks' elements."""
        words = torch.cat([ids, ids.new_tensor([end])]).to(id_dtype) if ids.numel() else ids.to(id_dtype)
        return words, self._take_blocks(flat, ids, partial)
