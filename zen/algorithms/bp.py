"""Balanced Parallelism (paper section 5.3): hash-partition, push COO point-to-point, aggregate once
at each server, pull the aggregated partitions back with the hash-bitmap encoding. `zen-bp-range` is the same
with equal contiguous ranges for partitions (zen.algorithms.partitions), for a near-dense union."""

from __future__ import annotations

from collections.abc import Callable

import torch

from zen.algorithms.partitions import PARTITIONS, HashPartitions, Partitioner, RangePartitions
from zen.comm.base import Communicator, Packed, count_meta, gather_v_meta
from zen.costmodel import Prediction, Sparsity
from zen.device import accelerated
from zen.encodings import PullMessage, get_encoding, nonzero_rows
from zen.grad import LocalGrad
from zen.hashing import HashFamily
from zen.output import Output
from zen.registry import register_scheme
from zen.rows import add_messages, add_rows
from zen.types import PhaseBytes, SyncStats, WireLayout

# compact path when received ids <= |S_r| / 3: on one CPU thread at 6.9M elements the compact sum and encode
# win up to between |S_r| / 3 and |S_r| / 2, at row widths 1 and 32 (scripts/bp_server_paths.py)
COMPACT_RATIO = 3
# BP's one-pass CPU server and pull (Encoding.aggregate, Output.write_bitmaps) up to this many servers: they
# keep n M / 8 bytes of membership words per tensor size and the pull reads them all each call, where the
# decode reads the members of the set bits only
BITS_SERVERS = 8


def compact_sum(received: list[PullMessage], width: int) -> PullMessage:
    """(ascending distinct ids, their non-zero sums) of the received messages. The sums are added message
    by message in rank order from zero, the same float operations as add_messages into a zeroed `out`."""
    rows, inverse = torch.unique(torch.cat([index for index, _ in received]), sorted=True, return_inverse=True)
    sums = received[0][1].new_zeros((rows.numel(), width))
    add_messages(sums, list(zip(inverse.split([int(index.numel()) for index, _ in received]),
                                [values for _, values in received], strict=True)))
    mask = nonzero_rows(sums)  # sums that cancelled to exactly zero are not sent
    if accelerated(sums.device):
        return rows[mask], sums[mask]  # no host read to skip a filter that keeps everything
    return (rows[mask], sums[mask]) if not bool(mask.all()) else (rows, sums)


@register_scheme("zen-bp")
class BalancedParallelism:
    """n = world size servers; server j owns the rows with h0(row) = j (`partitions="hash"`) or the j-th of n
    equal contiguous ranges (`"range"`)."""

    sparse_input = True
    label = "Zen BP"
    color = "#ff7f0e"
    marker = "o"

    def __init__(self, pull: str = "hash_bitmap", k: int = 3, r1_factor: float = 2.0, r2_ratio: float = 0.1,
                 partitions: str = "hash"):
        self.encoding = get_encoding(pull)  # ValueError listing the choices
        if k < 1 or r1_factor <= 0 or r2_ratio <= 0:
            raise ValueError("need k >= 1, r1_factor > 0 and r2_ratio > 0")
        if partitions not in PARTITIONS:
            raise ValueError(f"partitions must be one of {PARTITIONS}, got {partitions!r}")
        self.partitions = partitions
        self.pull = pull
        self.k = k
        self.r1_factor = r1_factor
        self.r2_ratio = r2_ratio

    def __call__(self, grad: LocalGrad, comm: Communicator, out: Output, stats: SyncStats) -> None:
        parts = self.partitioner(comm.shared_seed if self.partitions == "hash" else None)
        received = self.push(grad, comm, stats, parts)
        message, own = self.aggregate(grad, comm, out, stats, parts, received)
        self.pull_back(grad, comm, out, parts, message, own)

    def partitioner(self, seed: Callable[[], int] | None) -> Partitioner:
        """The call's partitions: hashed from the shared seed (fetched once per communicator), or ranges."""
        if seed is None:
            return RangePartitions()
        return HashPartitions(HashFamily.from_seed(seed(), self.k), self.r1_factor, self.r2_ratio)

    def push(self, grad: LocalGrad, comm: Communicator, stats: SyncStats,
             parts: Partitioner) -> list[PullMessage]:
        """Partition this rank's non-zeros, send each partition to its server; returns the (row ids,
        values) every rank pushed to us, in rank order (ours included). Where the input check announced
        every rank's rows, a rank's push to one server is bounded by all of them (one round on gloo)."""
        index, values = grad.rows()
        stats.nnz = int(index.numel())
        wire_index, wire_values, counts, serial = parts.group(index, values, comm.world_size, grad.index_dtype(),
                                                              grad.num_rows)
        if serial >= 0:
            stats.extra["serial_rows"] = float(serial)
        packed = Packed((wire_index, wire_values), counts)
        announced = comm.announced(grad)
        received = comm.all_to_all_v(packed, phase="push",
                                     bound=(lambda j: [announced[j]] * 2) if announced is not None else None)
        stats.push_counts = packed.rows
        return received

    def aggregate(self, grad: LocalGrad, comm: Communicator, out: Output, stats: SyncStats,
                  parts: Partitioner, received: list[PullMessage]
                  ) -> tuple[PullMessage, PullMessage | None]:
        """Sum what was pushed to us, message by message in rank order, and encode it for the pull.

        Only the received ids can be non-zero in our partition. On CPU, when they are few next to |S_r|,
        and whenever the output wants rows, the sums live in a compact buffer over the sorted distinct ids
        and the message is encoded from it (O(1) bitmap positions): no scattered adds into a dense buffer,
        no scan of all M / n rows of S_r there. Where the encoding has it (the hash bitmap, on CPU, up to
        BITS_SERVERS servers), one native pass does both from S_r's membership words, without the sort.
        Returns (message, our non-zero (ids, sums) to write later, or None if the dense buffer has them)."""
        r = comm.rank
        members, offsets = parts.server_rows(grad.num_rows, comm.world_size, grad.device)
        mine = members[offsets[r] : offsets[r + 1]]
        candidates = sum(int(index.numel()) for index, _ in received)
        if not out.rows_wanted and (accelerated(grad.device) or candidates * COMPACT_RATIO > mine.numel()):
            out.zero()
            add_messages(out.buffer, received)
            message, stats.server_count = self.encoding.encode(out.buffer, mine, grad.index_dtype())
            return message, None
        words = self._words(grad, comm.world_size, parts)
        if words is not None and (fast := self.encoding.aggregate(received, words[r], grad.num_rows)) is not None:
            message, stats.server_count = fast
            return message, None
        rows, sums = compact_sum(received, grad.row_width)
        positions = parts.server_ranks(grad.num_rows, comm.world_size, grad.device, r)
        message, stats.server_count = self.encoding.encode_rows(rows, sums, mine, grad.num_rows, positions,
                                                                grad.index_dtype())
        return message, (rows, sums)

    def pull_back(self, grad: LocalGrad, comm: Communicator, out: Output, parts: Partitioner,
                  message: PullMessage, own: PullMessage | None) -> None:
        """Ship our encoded partition to everyone and hand every partition's rows to `out`: on CPU (and for
        a rows output) as the decoded (ascending) row sets, which a dense output streams in one pass; on
        accelerator our rows (`own`, unless the buffer holds them) and the others' partitions scattered into it."""
        n, r = comm.world_size, comm.rank
        members, offsets = parts.server_rows(grad.num_rows, n, grad.device)
        decode, M = self.encoding.decode, grad.num_rows
        # the values go first on the wire: they land aligned (a view, not a copy), and a message the native
        # server built in one buffer (sums, then payload) goes out as it lies
        pulled = comm.all_gather_v((message[1], message[0]), phase="pull", bound=self._pull_bound(grad, comm, offsets))
        gathered = [(payload, values) for values, payload in pulled]
        if not accelerated(grad.device) or out.rows_wanted:
            if (words := self._words(grad, n, parts)) is not None and out.write_bitmaps(gathered, words):
                return  # every partition decoded on the way out, in one pass over the output
            sets = [(decode(payload, members[offsets[j] : offsets[j + 1]], M), values)
                    if j != r or own is None else own for j, (payload, values) in enumerate(gathered)]
            out.write(sets, disjoint=True)  # partitions are disjoint: each row is 0 + its sum, exactly the sum
            return
        buffer = out.buffer
        if own is not None:
            out.zero()
            add_rows(buffer, *own)
        for j, (payload, values) in enumerate(gathered):
            if j != r:
                self.encoding.scatter(buffer, payload, members[offsets[j] : offsets[j + 1]], values, M)

    def _pull_bound(self, grad: LocalGrad, comm: Communicator, offsets: tuple[int, ...]
                    ) -> Callable[[int], list[int]] | None:
        """Server j's pull message is at most min(|S_j|, all announced rows) values and its encoding's payload for
        as many; None where the check announced no rows or the encoding cannot say."""
        announced = comm.announced(grad)
        if announced is None or self.encoding.payload_rows(0, 0, grad.num_rows) is None:
            return None
        pushed = sum(announced)

        def bound(j: int) -> list[int]:
            owned = offsets[j + 1] - offsets[j]
            values = min(owned, pushed)
            return [values, int(self.encoding.payload_rows(owned, values, grad.num_rows) or 0)]

        return bound

    def _words(self, grad: LocalGrad, n: int, parts: Partitioner) -> torch.Tensor | None:
        """Every S_j as membership words where the encoding's one-pass CPU kernels can use them."""
        if not self.encoding.words or n > BITS_SERVERS or accelerated(grad.device):
            return None
        return parts.server_bits(grad.num_rows, n, grad.device)

    def closed_form(self, w: Sparsity) -> Prediction:
        """Push (n-1)/n of own COO, pull (n-1)/n of the union in the pull encoding (section 5)."""
        share = (w.n - 1) / w.n
        wire = WireLayout(w.n, w.rows, w.width, w.value_bytes, w.index_bytes)
        pulled = self.encoding.pull_bytes(wire, w.gamma(w.n) * w.nnz)
        return Prediction(share * w.nnz * w.coo_row + pulled, 2 * (w.n - 1))

    def predict(self, sets: list[torch.Tensor], layout: WireLayout) -> list[PhaseBytes]:
        """push_r = sum_{i != r} |I_i ∩ S_r| coo_row; pull_r = sum_{j != r} payload_j (section 4)."""
        P, M = layout.world_size, layout.rows
        if P == 1:
            return [{}]
        parts = self.partitioner((lambda: layout.seed) if self.partitions == "hash" else None)
        sent = torch.stack([torch.bincount(parts.owners(s, P, M), minlength=P) for s in sets])  # [i, j]
        union = torch.bincount(parts.owners(torch.unique(torch.cat(sets)), P, M), minlength=P).tolist()
        _, offsets = parts.server_rows(M, P, torch.device("cpu"))
        owned = [offsets[j + 1] - offsets[j] for j in range(P)]
        payload = [self.encoding.payload_bytes(owned[j], union[j], layout) for j in range(P)]
        pushed_to = sent.sum(0).tolist()
        return [{"push": (pushed_to[r] - int(sent[r, r])) * layout.coo_row,
                 "pull": sum(payload) - payload[r], "meta": count_meta(P) + gather_v_meta(P)} for r in range(P)]


@register_scheme("zen-bp-range")
class RangeParallelism(BalancedParallelism):
    """BP over equal contiguous ranges: for a near-dense union, where the ranges are as even as the hash
    partitions and without their statistical spread (zen.algorithms.partitions)."""

    label = "Zen BP (ranges)"
    color = "#ff9896"
    marker = "s"

    def __init__(self, pull: str = "hash_bitmap", **options: object) -> None:
        super().__init__(pull, partitions="range", **options)  # type: ignore[arg-type]
