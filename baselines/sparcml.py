"""SparCML (Renggli et al., SC'19): sparse allreduce over streams that turn dense as they fill.

A stream covers the rows [lo, lo + n) of the M rows of width D and is either sparse (ascending global
row ids, values (k, D)) or dense (all n rows). Whenever a stream is built, cut or summed it becomes
dense, and stays dense, once its sparse form would cost at least the dense one: before a merge,
(nnz_a + nnz_b) (s_i + D s_v) >= n D s_v. On the wire a stream is the message (row ids, values); a
dense one sends no row ids and all n rows. Counts travel before payload, so the receiver tells them
apart: 0 ids with n > 0 rows is dense, a sparse stream has as many ids as rows.

Variants (`variant=`); all first fold P to p' = 2^floor(log2 P) ranks: of the first 2 (P - p')
ranks, even ones hand their stream to the odd neighbour (phase "fold"), sit out and get the result
back (phase "unfold").
- ssar_recursive_double: log2 p' rounds (phase "reduce"), partner = vrank XOR 2^r, whole streams
  exchanged and summed. Small inputs: log2 p' messages.
- ssar_split_allgather: [0, M) is cut into p' equal contiguous ranges; each vrank sends its piece of
  range j straight to vrank j (one all-to-all among the p' ranks, phase "reduce_scatter"), which sums the p'
  pieces in vrank order; the disjoint reduced slices (global row ids) are then all-gathered by
  recursive doubling (phase "allgather"). Large inputs: each row crosses about twice.
- dsar_split_allgather: the same reduce-scatter, then dense slices are all-gathered.
- auto (default): DSAR when the result is expected to be dense, U (s_i + D s_v) > M D s_v with U
  estimated as M (1 - prod_i (1 - k_i / M)), the union of independent uniform supports; otherwise
  recursive doubling when the largest input stream is at most `small_bytes`, split-allgather above.
  The k_i come from one fixed all-gather (phase "meta", zen.comm.base), so all ranks choose alike,
  and `predict` makes the same choice from the sizes of the index sets. `switch_width` makes the switch
  and the variant decide as if rows were that wide (the simulator records a wide problem narrow).

Bytes a rank receives, with |S| = k (s_i + D s_v) for a sparse stream of k rows and n D s_v for a
dense one, X_v the stream of vrank v after the fold, n_v the length of range v (payload; each
message also brings its header under "meta", zen.prediction.message_meta, and a message of several
streams 8 bytes per stream saying its size, counted with the payload):
- fold (odd ranks below 2 (P - p')): |stream of the even neighbour|; unfold (even ranks): |result|,
  the sum of the slice sizes for the split variants (M D s_v for DSAR), plus 8 p' bytes of sizes.
- ssar_recursive_double, round r: |sum of X_u over the partner's block of 2^r vranks|; with identical
  supports of k rows log2(p') k (s_i + D s_v) in all, with disjoint ones (p' - 1) k (s_i + D s_v).
- reduce_scatter: sum over u != v of |X_u cut to range v|.
- allgather: ssar sum over j != v of |reduced slice j|; dsar (M - n_v) D s_v; both plus 8 (p' - 2)
  bytes of sizes (rounds 2.. bring several slices). With identical supports (no switch): reduce_scatter +
  allgather = ((p' - 1) k_v + k - k_v) (s_i + D s_v) + 8 (p' - 2).
`predict` replays the variant on the index sets (`Replay`): the switch depends on row counts only.

Faithful: the stream format and the dense switch (also applied when a stream is built or cut, so a
full input starts dense), the fold, each variant's message pattern and byte counts, sums in the
input dtype. Not faithful: no non-blocking overlap and no low-precision quantization;
a dense slice is not re-sparsified; the sparse sum is a sort (torch.unique), not a linear merge;
the auto rule's U estimate and `small_bytes` threshold are ours (the paper picks by measured
crossovers). Each step sums exactly two streams (a + b == b + a bitwise), or one owner sums and
forwards, so every rank ends bit-identical.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, replace
from functools import reduce

import torch

from baselines.sparse_ps import even_bounds
from zen.comm.base import HEAD_BYTES, Communicator, Deferred, Message, gather_meta
from zen.costmodel import Prediction, Sparsity
from zen.device import accelerated
from zen.fold import Fold
from zen.grad import LocalGrad
from zen.output import Output
from zen.registry import register_scheme
from zen.rows import add_rows, concat, put_rows
from zen.types import PhaseBytes, SyncStats, WireLayout, ZenInputError

VARIANTS = ("ssar_recursive_double", "ssar_split_allgather", "dsar_split_allgather")


def dense_switch(layout: WireLayout, nnz: int, n: int) -> bool:
    """SparCML's dense switch: nnz of n rows cost at least as much sparse as dense."""
    return nnz * layout.coo_row >= n * layout.width * layout.value_bytes


def decision_layout(layout: WireLayout, switch_width: int | None) -> WireLayout:
    """`layout` with the row width SparCML's choices are made at: the true one, or `switch_width`, so that a
    narrow problem takes exactly the choices of a wide one (simulator/widths.py records SparCML at widths 1
    and 2 that way: every message's bytes are then affine in the width)."""
    return layout if switch_width is None else replace(layout, width=switch_width)


def split_ranges(rows: int, parts: int) -> list[tuple[int, int]]:
    """(lo, n) of the p' even contiguous ranges the split variants cut [0, M) into."""
    b = even_bounds(rows, parts)
    return [(b[j], b[j + 1] - b[j]) for j in range(parts)]


@dataclass
class Stream:
    """Rows [lo, lo + n): sparse (index = ascending global int64 row ids) or dense (index None)."""

    lo: int
    n: int
    index: torch.Tensor | None
    values: torch.Tensor

    @property
    def nnz(self) -> int:
        return self.n if self.index is None else int(self.index.numel())


@dataclass(frozen=True)
class StreamOps:
    """Stream arithmetic and wire format for one gradient's shape and dtypes."""

    layout: WireLayout
    index_dtype: torch.dtype
    values_like: torch.Tensor  # (0, D) in the value dtype
    switch_width: int | None = None  # `SparCML(switch_width=)`: the width the switch decides at

    @property
    def width(self) -> int:
        return self.layout.width

    @property
    def decision(self) -> WireLayout:
        """The layout the dense switch and the variant are decided on (`decision_layout`)."""
        return decision_layout(self.layout, self.switch_width)

    def switch(self, nnz: int, n: int) -> bool:
        return dense_switch(self.decision, nnz, n)

    def make(self, lo: int, n: int, index: torch.Tensor, values: torch.Tensor) -> Stream:
        if n and self.switch(int(index.numel()), n):
            dense = values.new_zeros((n, self.width))
            put_rows(dense, index - lo, values)
            return Stream(lo, n, None, dense)
        return Stream(lo, n, index, values)

    def merge(self, a: Stream, b: Stream) -> Stream:
        """a + b with the dense switch; symmetric in a and b down to the bits."""
        lo, n = a.lo, a.n
        if a.index is None and b.index is None:
            return Stream(lo, n, None, a.values + b.values)
        if a.index is None or b.index is None or self.switch(a.nnz + b.nnz, n):
            base, other = (a, b) if b.index is not None else (b, a)
            dense = base.values.clone() if base.index is None else self.densify(base).values
            add_rows(dense, other.index - lo, other.values)
            return Stream(lo, n, None, dense)
        index, inverse = torch.unique(torch.cat([a.index, b.index]), sorted=True, return_inverse=True)
        values = a.values.new_zeros((index.numel(), self.width))
        values.index_add_(0, inverse, torch.cat([a.values, b.values]))
        return Stream(lo, n, index, values)

    def densify(self, s: Stream) -> Stream:
        if s.index is None:
            return s
        dense = s.values.new_zeros((s.n, self.width))
        put_rows(dense, s.index - s.lo, s.values)
        return Stream(s.lo, s.n, None, dense)

    def encode(self, streams: list[Stream]) -> Message:
        """One stream: (row ids, values), a dense stream with no ids. Several: (all ids, all values, ids per
        stream with -1 for a dense one), three tensors whatever their number (a header holds few counts)."""
        ids = [torch.empty(0, dtype=self.index_dtype, device=s.values.device) if s.index is None
               else s.index.to(self.index_dtype) for s in streams]
        if len(streams) == 1:
            return ids[0], streams[0].values
        desc = torch.tensor([-1 if s.index is None else int(s.index.numel()) for s in streams], dtype=torch.int64,
                            device=self.values_like.device)
        return concat(ids), concat([s.values for s in streams]), desc

    def join(self, a: Message, b: Message) -> Message:
        """Two bundles of consecutive ranges as one (a's streams first)."""
        return tuple(torch.cat([x, y]) for x, y in zip(a, b, strict=True))

    def template(self, count: int) -> Message:
        empty = torch.empty(0, dtype=self.index_dtype, device=self.values_like.device)
        if count == 1:
            return empty, self.values_like
        return empty, self.values_like, torch.empty(0, dtype=torch.int64, device=self.values_like.device)

    @staticmethod
    def dense(message: Message) -> bool:
        """Whether a one-stream message holds a dense stream: no ids, some rows (from shapes alone)."""
        index, values = message
        return index.numel() == 0 and values.shape[0] > 0

    def decode(self, message: Message, lo: int, n: int) -> Stream:
        """A one-stream message back as the stream over [lo, lo + n) (sizes from the header: no host read)."""
        return Stream(lo, n, None if self.dense(message) else message[0].long(), message[1])

    def bundle(self, message: Message) -> Message:
        """A message as (ids, values, ids per stream): a one-stream message gets its stream size from its
        shapes, so slices gathered over rounds are joined and forwarded without reading sizes on the host."""
        if len(message) == 3:
            return message
        index, values = message
        size = -1 if self.dense(message) else index.numel()
        return index, values, torch.tensor([size], dtype=torch.int64, device=values.device)

    def row_ids(self, bundle: Message, ranges: list[tuple[int, int]]) -> torch.Tensor:
        """The output row of each value row of a bundle, computed on the device from its stream sizes: a dense
        stream's rows are its range, a sparse one's its ids."""
        index, values, desc = bundle
        dev = values.device
        lo = torch.tensor([a for a, _ in ranges], dtype=torch.int64, device=dev)
        n = torch.tensor([b for _, b in ranges], dtype=torch.int64, device=dev)
        dense = desc < 0
        ids = desc.clamp(min=0)
        rows = torch.where(dense, n, ids)
        row_end, id_end = rows.cumsum(0), ids.cumsum(0)
        t = torch.arange(values.shape[0], device=dev)
        s = torch.searchsorted(row_end, t, right=True)
        at = t - (row_end - rows)[s]
        padded = torch.cat([index.long(), index.new_zeros(1, dtype=torch.int64)])
        sparse_row = padded[((id_end - ids)[s] + at).clamp(max=index.numel())]
        return torch.where(dense[s], lo[s] + at, sparse_row)

    def write(self, out: torch.Tensor, s: Stream) -> None:
        if s.index is None:
            out[s.lo : s.lo + s.n].copy_(s.values)
        else:
            put_rows(out, s.index, s.values)

    def write_bundle(self, out: torch.Tensor, bundle: Message, ranges: list[tuple[int, int]]) -> None:
        """On an accelerator by device-computed row ids (no host read); on the host, where reading the stream
        sizes costs nothing, stream by stream (4x faster than the row ids at 2^24 rows, 4 ranks, 1%)."""
        if accelerated(out.device):
            put_rows(out, self.row_ids(bundle, ranges), bundle[1])
            return
        index, values, desc = bundle
        at_id = at_row = 0
        for (lo, n), k in zip(ranges, desc.tolist(), strict=True):
            rows = n if k < 0 else k
            ids = None if k < 0 else index[at_id : at_id + k].long()
            self.write(out, Stream(lo, n, ids, values[at_row : at_row + rows]))
            at_id, at_row = at_id + max(k, 0), at_row + rows


def choose_variant(counts: list[int], layout: WireLayout, small_bytes: int) -> str:
    """The paper's selection, from quantities every rank shares (the all-gathered k_i, M and the sizes)."""
    row, M = layout.coo_row, layout.rows
    miss = math.prod(1.0 - k / M for k in counts) if M else 1.0
    if (1.0 - miss) * row > layout.width * layout.value_bytes:
        return "dsar_split_allgather"
    return "ssar_recursive_double" if max(counts) * row <= small_bytes else "ssar_split_allgather"


@dataclass(frozen=True)
class Support:
    """What a stream's bytes depend on: its range, its row ids (ascending) and whether it is dense."""

    lo: int
    n: int
    rows: torch.Tensor
    dense: bool


class Replay:
    """The variants replayed on index sets (StreamOps' switch on row counts), tallying received bytes."""

    def __init__(self, layout: WireLayout, switch_width: int | None = None):
        self.layout = layout
        self.decision = decision_layout(layout, switch_width)
        self.got: list[PhaseBytes] = [defaultdict(int) for _ in range(layout.world_size)]

    def make(self, lo: int, n: int, rows: torch.Tensor) -> Support:
        return Support(lo, n, rows, n > 0 and dense_switch(self.decision, int(rows.numel()), n))

    def cut(self, s: Support, lo: int, n: int) -> Support:
        rows = s.rows[(s.rows >= lo) & (s.rows < lo + n)]
        return Support(lo, n, rows, True) if s.dense else self.make(lo, n, rows)

    def merge(self, a: Support, b: Support) -> Support:
        dense = a.dense or b.dense or dense_switch(self.decision, int(a.rows.numel() + b.rows.numel()), a.n)
        return Support(a.lo, a.n, torch.unique(torch.cat([a.rows, b.rows])), dense)

    def receive(self, rank: int, phase: str, streams: list[Support]) -> None:
        """`streams` arriving in one message: its header, and with several streams their sizes (8 bytes each,
        `StreamOps.encode`)."""
        L = self.layout
        self.got[rank][phase] += sum(s.n * L.width * L.value_bytes if s.dense else int(s.rows.numel()) * L.coo_row
                                     for s in streams)
        if len(streams) > 1:
            self.got[rank][phase] += 8 * len(streams)
        self.got[rank]["meta"] += HEAD_BYTES

    def run(self, sets: list[torch.Tensor], variant: str) -> list[PhaseBytes]:
        """Fold, the variant on the p' vranks' streams X_v, unfold (as `SparCML.__call__`)."""
        fold = Fold(self.layout.world_size)
        streams = [self.make(0, self.layout.rows, s) for s in sets]
        for sitter, holder in fold.pairs:
            self.receive(holder, "fold", [streams[sitter]])
            streams[holder] = self.merge(streams[holder], streams[sitter])
        ranks = fold.active
        X = [streams[r] for r in ranks]
        if variant == "ssar_recursive_double":
            result = self.recursive_double(X, ranks)
        else:
            result = self.split_allgather(X, ranks, dense=variant == "dsar_split_allgather")
        for sitter, _ in fold.pairs:
            self.receive(sitter, "unfold", result)
        return [dict(g) for g in self.got]

    def recursive_double(self, X: list[Support], ranks: list[int]) -> list[Support]:
        for level in range(len(X).bit_length() - 1):
            for v, r in enumerate(ranks):
                self.receive(r, "reduce", [X[v ^ (1 << level)]])
            X = [self.merge(X[v], X[v ^ (1 << level)]) for v in range(len(X))]
        return [X[0]]

    def split_allgather(self, X: list[Support], ranks: list[int], dense: bool) -> list[Support]:
        slices = []
        for v, (lo, n) in enumerate(split_ranges(self.layout.rows, len(X))):
            pieces = [self.cut(x, lo, n) for x in X]
            for piece in pieces[:v] + pieces[v + 1 :]:
                self.receive(ranks[v], "reduce_scatter", [piece])
            mine = reduce(self.merge, pieces)
            slices.append(Support(lo, n, mine.rows, True) if dense else mine)
        for v, r in enumerate(ranks):
            for level in range(len(X).bit_length() - 1):
                theirs = ((v >> level) << level) ^ (1 << level)
                self.receive(r, "allgather", slices[theirs : theirs + (1 << level)])
        return slices


@register_scheme("sparcml")
class SparCML:
    sparse_input = True
    label, color, marker = "SparCML", "#2ca02c", "^"  # how figures show it

    def __init__(self, variant: str = "auto", small_bytes: int = 1 << 16, switch_width: int | None = None):
        if variant not in (*VARIANTS, "auto"):
            raise ZenInputError(f"sparcml variant must be one of {(*VARIANTS, 'auto')}, got {variant!r}")
        if switch_width is not None and (not isinstance(switch_width, int) or switch_width < 1):
            raise ZenInputError(f"sparcml switch_width must be a positive int or None, got {switch_width!r}")
        self.variant = variant
        self.small_bytes = small_bytes
        self.switch_width = switch_width

    def __call__(self, grad: LocalGrad, comm: Communicator, out: Output, stats: SyncStats) -> None:
        index, values = grad.rows()
        stats.nnz = int(index.numel())
        M = grad.num_rows
        layout = WireLayout(comm.world_size, M, grad.row_width, grad.dtype.itemsize, grad.index_dtype().itemsize)
        ops = StreamOps(layout, grad.index_dtype(), values[:0], self.switch_width)
        variant = self.variant
        if variant == "auto":
            counts = [row[0] for row in comm.all_gather_fixed([stats.nnz], phase="meta")]
            variant = choose_variant(counts, ops.decision, self.small_bytes)
        stats.choice = variant
        fold, r = Fold(comm.world_size), comm.rank
        split = variant != "ssar_recursive_double"
        ranges = split_ranges(M, fold.p2) if split else [(0, M)]
        stream = ops.make(0, M, index, values)
        sits_out = fold.sits_out(r)
        partner = fold.partner(r) if fold.folded(r) else None
        rounds = Rounds(comm, ops)
        if fold.extra:  # the even rank of each folded pair hands its stream to the odd one
            got = rounds.run(partner if sits_out else None, [stream], None if sits_out else partner, (0, M), "fold")
            if got is not None:
                stream = ops.merge(stream, got)
        if sits_out:  # every rank joins every round, a sitter with nothing to say
            if split:
                comm.all_to_all_v(Deferred(ops.template(1), torch.zeros(0, dtype=torch.int64), lambda _: [], peers=[]),
                                  "reduce_scatter")  # no peers: it only joins the header round
            rounds.idle(fold.levels)
            result = ops.bundle(ops.encode([stream]))
        elif split:
            result = self._split_allgather(ops, rounds, stream, ranges, fold, fold.vrank(r), variant)
        else:
            result = ops.bundle(ops.encode([self._recursive_double(ops, rounds, stream, fold, fold.vrank(r))]))
        if fold.extra:
            got = rounds.exchange(None if sits_out else partner, result, partner if sits_out else None,
                                  len(ranges), "unfold")
            if got is not None:
                result = got
        out.zero()
        ops.write_bundle(out.buffer, result, ranges)
        stats.extra["dense_rows"] = float(result[1].shape[0] - result[0].shape[0])

    def closed_form(self, w: Sparsity) -> Prediction:
        """SSAR recursive doubling with the dense switch: each round's stream is capped at dense size."""
        levels = Fold(w.n).levels
        dense = w.rows * w.width * w.value_bytes
        return Prediction(sum(min(w.gamma(1 << i) * w.nnz * w.coo_row, dense) for i in range(levels)), levels)

    def predict(self, sets: list[torch.Tensor], layout: WireLayout) -> list[PhaseBytes]:
        """The variant `__call__` picks, replayed on the index sets (plus the k_i all-gather for auto)."""
        P = layout.world_size
        if P == 1:
            return [{}]
        variant = self.variant
        if variant == "auto":
            variant = choose_variant([int(s.numel()) for s in sets], decision_layout(layout, self.switch_width),
                                     self.small_bytes)
        got = Replay(layout, self.switch_width).run(sets, variant)
        if self.variant == "auto":
            for phases in got:
                phases["meta"] += gather_meta(P)
        return got

    def _recursive_double(self, ops: StreamOps, rounds: Rounds, stream: Stream, fold: Fold, vrank: int) -> Stream:
        """SSAR_Recursive_double: round r sums the streams of two blocks of 2^r vranks."""
        for level in range(fold.levels):
            peer = fold.peer(vrank, level)
            got = rounds.run(peer, [stream], peer, (stream.lo, stream.n), "reduce")
            assert got is not None
            stream = ops.merge(stream, got)
        return stream

    def _split_allgather(self, ops: StreamOps, rounds: Rounds, stream: Stream, ranges: list[tuple[int, int]],
                         fold: Fold, vrank: int, variant: str) -> Message:
        """Split reduce-scatter to the owner of each range (one all-to-all among the active ranks, its cut
        points read with its headers), then a recursive-doubling allgather of the reduced slices, forwarded
        as bundles. Returns the bundle of all p' slices."""
        comm, p2 = rounds.comm, fold.p2
        received = comm.all_to_all_v(self._pieces(ops, stream, ranges, fold), "reduce_scatter")
        lo, n = ranges[vrank]
        mine = ops.decode(received[fold.real(0)], lo, n)
        for u in range(1, p2):
            mine = ops.merge(mine, ops.decode(received[fold.real(u)], lo, n))
        if variant == "dsar_split_allgather":
            mine = ops.densify(mine)
        held = ops.bundle(ops.encode([mine]))  # the slices of vranks [first, first + size)
        for level in range(fold.levels):
            size = 1 << level
            own = (vrank >> level) << level
            peer = fold.peer(vrank, level)
            got = rounds.exchange(peer, held, peer, size, "allgather")
            assert got is not None
            held = ops.join(held, got) if own < (own ^ size) else ops.join(got, held)
        return held

    @staticmethod
    def _pieces(ops: StreamOps, stream: Stream, ranges: list[tuple[int, int]], fold: Fold) -> Deferred:
        """Our stream cut to every range, to its owner: per real rank (ids, rows, first, end) on the device,
        each piece dense when its cut calls for it (the same switch as `StreamOps.make`)."""
        P, dev = fold.world_size, stream.values.device
        n = torch.tensor([b for _, b in ranges], dtype=torch.int64, device=dev)
        if stream.index is None:
            ends = torch.tensor([a for a, _ in ranges] + [stream.n], dtype=torch.int64, device=dev)
            ids, rows = torch.zeros_like(n), n
        else:
            bounds = torch.tensor([a for a, _ in ranges] + [stream.lo + stream.n], dtype=stream.index.dtype,
                                  device=dev)
            ends = torch.searchsorted(stream.index, bounds)
            k = ends.diff()
            dense = (k * ops.decision.coo_row >= n * ops.decision.width * ops.decision.value_bytes) & (n > 0)
            ids, rows = torch.where(dense, 0, k), torch.where(dense, n, k)
        active = torch.tensor(fold.active, device=dev)
        counts = torch.zeros(P, 4, dtype=torch.int64, device=dev)
        counts[active] = torch.stack([ids, rows, ends[:-1], ends[1:]], 1)

        def build(got: list[list[int]]) -> list[Message]:
            pieces: list[Message] = [ops.template(1)] * P
            for u, (lo, size) in enumerate(ranges):
                j = fold.real(u)
                if stream.index is None:
                    piece = Stream(lo, size, None, stream.values[lo - stream.lo : lo - stream.lo + size])
                else:
                    a, b = got[j][2:]
                    piece = ops.make(lo, size, stream.index[a:b], stream.values[a:b])
                pieces[j] = ops.encode([piece])
            return pieces

        return Deferred(ops.template(1), counts, build, peers=fold.active)


@dataclass
class Rounds:
    """SparCML's exchanges as rounds every rank of the group joins (`Communicator.exchange`)."""

    comm: Communicator
    ops: StreamOps

    def exchange(self, to: int | None, bundle: Message, source: int | None, count: int, phase: str
                 ) -> Message | None:
        """Send the streams of `bundle` to `to` and/or receive a bundle of `count` streams from `source`; a
        one-stream message travels without its size."""
        wire = bundle[:2] if count == 1 else bundle
        got = self.comm.exchange({to: wire} if to is not None else {},
                                 {source: self.ops.template(count)} if source is not None else {}, phase)
        return self.ops.bundle(got[source]) if source is not None else None

    def run(self, to: int | None, streams: list[Stream], source: int | None, span: tuple[int, int], phase: str
            ) -> Stream | None:
        """Send one stream to `to` and/or receive one over `span` from `source`."""
        got = self.comm.exchange({to: self.ops.encode(streams)} if to is not None else {},
                                 {source: self.ops.template(1)} if source is not None else {}, phase)
        return self.ops.decode(got[source], *span) if source is not None else None

    def idle(self, count: int) -> None:
        for _ in range(count):
            self.comm.exchange({}, {}, "idle")
