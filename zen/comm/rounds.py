"""The size-carrying exchanges: a header round (call, code, layout, each tensor's row count per peer, read on
the host once), then the payload round sized from it, never from the receiver's guess; every rank of the group
joins both, also a rank with nothing to send. With a bound and a backend that takes short receives they take
one round instead (zen.comm.bounded)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from zen.comm.bounded import BoundedRounds
from zen.comm.wire import (
    HEAD_BYTES,
    HEAD_SLOTS,
    META,
    PAD,
    Deferred,
    Message,
    Packed,
    check_template,
    layout_code,
    message_bytes,
    offsets,
    pack,
    row_bytes,
    unpack,
)


class Rounds(BoundedRounds):
    """The counted exchanges of zen.comm.base.Communicator: `exchange`, `all_to_all_v`, `all_gather_v`."""

    def exchange(self, sends: Mapping[int, Message], recvs: Mapping[int, Message], phase: str,
                 bound: Callable[[int], Sequence[int]] | None = None) -> dict[int, Message]:
        """One round of point-to-point messages: `sends[j]` goes to rank j, and a message comes from every
        rank in `recvs` (its value: a template of dtypes and row shapes). Every rank of the group calls it,
        with whatever it has (possibly nothing); peers must name each other. Returns what came, by rank.
        `bound(j)`: the most rows per tensor rank j's message in this round can have, the same on every rank
        (one round instead of two where the backend takes short messages; see the module docstring)."""
        for peer in (*sends, *recvs):
            if not 0 <= peer < self.world_size or peer == self.rank:
                raise ValueError(f"rank {self.rank}: exchange with rank {peer} of a group of {self.world_size}")
        counts = {j: [int(t.shape[0]) for t in m] for j, m in sends.items()}
        if bound is not None and self.short_receives:
            return self._bounded_round(sends, counts, recvs, phase, bound)
        return self._round(sends, counts, recvs, phase, lambda _: [sends[j] for j in sorted(sends)])

    def all_to_all_v(self, messages: Sequence[Message] | Packed | Deferred, phase: str,
                     bound: Callable[[int], Sequence[int]] | None = None) -> list[Message]:
        """messages[j] goes to rank j (a list, one `Packed` layout, or `Deferred` messages); returns the message
        received from each rank, in rank order (our own as it is; an empty template from a non-peer). `bound(j)`
        as in `exchange` (for a list or a `Packed` layout): one round where the backend takes short messages."""
        P, r = self.world_size, self.rank
        if isinstance(messages, Deferred):
            return self._all_to_all_deferred(messages, phase)
        if bound is not None and self.short_receives and P > 1:
            if isinstance(messages, Packed):
                counts = messages.counts
                rows = self.host(counts) if isinstance(counts, torch.Tensor) else [int(c) for c in counts]
                messages.rows, bounds = rows, offsets(rows)
                messages = [tuple(t[bounds[j] : bounds[j + 1]] for t in messages.tensors) for j in range(P)]
            sends = {j: m for j, m in enumerate(messages) if j != r}
            got = self.exchange(sends, {j: messages[r] for j in sends}, phase, bound)
            return [messages[r] if j == r else got[j] for j in range(P)]
        if not isinstance(messages, Packed):
            if P == 1:
                return [messages[0]]
            sends = {j: m for j, m in enumerate(messages) if j != r}
            counts = {j: [int(t.shape[0]) for t in m] for j, m in sends.items()}
            got = self._round(sends, counts, {j: messages[r] for j in sends}, phase,
                              lambda _: [sends[j] for j in sorted(sends)])
            return [messages[r] if j == r else got[j] for j in range(P)]
        tensors = messages.tensors
        if P == 1:
            messages.rows = [int(tensors[0].shape[0])]
            return [tensors]
        template = tuple(t[:0] for t in tensors)
        counts = messages.counts
        if not isinstance(counts, torch.Tensor):
            counts = torch.tensor([int(c) for c in counts], dtype=torch.int64)
        bounds: list[int] = []

        def payload(rows: list[int]) -> list[Message]:
            messages.rows = rows
            bounds.extend(offsets(rows))
            return [tuple(t[bounds[j] : bounds[j + 1]] for t in tensors) for j in range(P) if j != r]

        others = {j: template for j in range(P) if j != r}
        got = self._round(others, counts, others, phase, payload)
        return [tuple(t[bounds[r] : bounds[r + 1]] for t in tensors) if j == r else got[j] for j in range(P)]

    def _all_to_all_deferred(self, messages: Deferred, phase: str) -> list[Message]:
        P, r = self.world_size, self.rank
        template = tuple(t[:0] for t in messages.template)
        peers = {j: template for j in (range(P) if messages.peers is None else messages.peers) if j != r}
        if P > 1 and not peers:  # a rank with no one to talk to still joins the header round (its counts unused)
            self._round({}, {}, {}, phase, lambda _: [])
            return [template] * P
        counts = messages.counts.view(P, -1)
        if P == 1:
            messages.rows = [[int(c) for c in row] for row in self.host(counts)]
            return [messages.build(messages.rows)[0]]
        built: list[Message] = []

        def payload(rows: list[list[int]]) -> list[Message]:
            messages.rows = rows
            built.extend(messages.build(rows))
            for j in (*peers, r):
                got = [int(t.shape[0]) for t in built[j]]
                if got != rows[j][: len(template)]:
                    raise ValueError(f"all_to_all_v: a deferred message to rank {j} has {got} rows, its counts "
                                     f"said {rows[j][: len(template)]}")
            return [built[j] for j in sorted(peers)]

        got = self._round(peers, counts, peers, phase, payload)
        return [built[r] if j == r else got.get(j, template) for j in range(P)]

    def _round(self, sends: Mapping[int, Message], counts: Mapping[int, list[int]] | torch.Tensor,
               recvs: Mapping[int, Message], phase: str,
               payload: Callable[[list[Any]], list[Message]]) -> dict[int, Message]:
        """A header round, then a payload round, each joined by every rank of the group.

        `sends` (destination -> a message, or its template) and `counts` (its tensors' row counts per
        destination; or a (P,) tensor, maybe on the device, of rows per destination for every tensor, read
        on the host together with the received headers) make the headers; `payload(rows per destination)`
        then gives the messages to send, in destination order. One host read per round, of the headers."""
        for m in (*sends.values(), *recvs.values()):
            check_template(m)
        received, mine = self._header_round(sends, counts, recvs, phase)
        return self._payload_round(sends, recvs, received, payload(mine), phase)

    def _header_round(self, sends: Mapping[int, Message], counts: Mapping[int, list[int]] | torch.Tensor,
                      recvs: Mapping[int, Message], phase: str) -> tuple[dict[int, list[int]], list[Any]]:
        """The headers of `_round`: the row counts every source's header gives (once its call, code and layout
        agree with ours), and `counts` as read on the host when they were a tensor (else [])."""
        P, r = self.world_size, self.rank
        head = torch.zeros((P, HEAD_SLOTS), dtype=torch.int64)
        for j, m in sends.items():
            head[j, :3] = torch.tensor(self._stamp(m))
            if not isinstance(counts, torch.Tensor):
                head[j, 3 : 3 + len(m)] = torch.tensor(counts[j], dtype=torch.int64)
        wire = self._wire_device()
        device_counts = counts.view(P, -1) if isinstance(counts, torch.Tensor) else None
        counts_read = device_counts is not None and device_counts.device.type != "cpu" and wire.type == "cpu"
        if counts_read:  # a host wire (gloo) and counts on a GPU: read them before the round, its one host read
            device_counts = torch.tensor(self.host(device_counts), dtype=torch.int64)
        elif device_counts is not None:
            device_counts = device_counts.to(wire)
        head = head.to(wire)  # the headers travel where the backend reads (gloo cannot read device memory)
        if device_counts is not None and sends:
            width = len(next(iter(sends.values())))
            head[:, 3 : 3 + width] = (device_counts.expand(-1, width) if device_counts.shape[1] == 1
                                      else device_counts[:, :width])
            head[r, 3:] = 0
        send_sizes = [HEAD_BYTES if j in sends else 0 for j in range(P)]
        recv_sizes = [HEAD_BYTES if j in recvs else 0 for j in range(P)]
        rows_out = head[[j for j in range(P) if j in sends]] if len(sends) < P else head
        heads = self._guard("exchange(headers)", phase,
                            lambda: self._all_to_all(rows_out.view(torch.uint8).view(-1), send_sizes, recv_sizes))
        if sends or recvs:
            self.traffic.add(META, sum(send_sizes), sum(recv_sizes))
            self.traffic.rounds += 1
        table = heads.view(torch.int64)
        if device_counts is not None:
            table = torch.cat([table, device_counts.reshape(-1)])
        flat = (table.tolist() if counts_read else self.host(table)) if table.numel() else []
        mine: list = []
        if device_counts is not None:
            C = device_counts.shape[1]
            mine = flat[len(flat) - P * C :]
            if C > 1:
                mine = [mine[j * C : (j + 1) * C] for j in range(P)]
        sources = [j for j in range(P) if j in recvs]
        received = {j: self._header_rows(flat[i * HEAD_SLOTS : (i + 1) * HEAD_SLOTS], recvs[j], j, phase)
                    for i, j in enumerate(sources)}
        return received, mine

    def _payload_round(self, sends: Mapping[int, Message], recvs: Mapping[int, Message],
                       received: dict[int, list[int]], messages: list[Message], phase: str) -> dict[int, Message]:
        """The payload of `_round`: `messages` to the destinations of `sends` in order, what came from every
        source sized by its header's rows (`received`)."""
        P = self.world_size
        sizes_out = [0] * P
        for j, m in zip(sorted(sends), messages, strict=True):
            sizes_out[j] = sum(t.numel() * t.element_size() for t in m)
        sizes_in = [message_bytes(received[j], row_bytes(recvs[j])) if j in received else 0 for j in range(P)]
        buf = pack(messages, self._wire_device(), self.pool)
        got = self._guard("exchange", phase, lambda: self._all_to_all(buf, sizes_out, sizes_in))
        if sends or recvs:
            self.traffic.add(phase, sum(sizes_out), sum(sizes_in))
        out, offset = {}, 0
        for j in (j for j in range(P) if j in recvs):
            out[j] = unpack(got[offset : offset + sizes_in[j]], received[j], recvs[j])
            offset += sizes_in[j]
        return out

    def all_gather_v(self, message: Message, phase: str,
                     bound: Callable[[int], Sequence[int]] | None = None) -> list[Message]:
        """Every rank's message, in rank order. Its header is one fixed all-gather of the layout and the
        row counts; the payload travels exactly (gloo, the simulated group) or padded to the largest
        message (`pads_all_gather`: NCCL's all-gather takes equal sizes; the padding is counted as "pad").
        `bound(j)` as in `exchange`: where the backend takes short messages, the header travels in front of
        the payload instead, one round."""
        P, r = self.world_size, self.rank
        if P == 1:
            return [message]
        check_template(message)
        if bound is not None and self.short_receives:
            return self._bounded_gather(message, phase, bound)
        counts = [int(t.shape[0]) for t in message]
        table = self.all_gather_fixed([layout_code(message), *counts])
        self._same_layouts({row[0] for row in table}, phase)
        widths = row_bytes(message)
        sizes = [message_bytes(row[1:], widths) for row in table]
        buf = pack([message], self._wire_device(), self.pool)
        got = self._guard("all_gather_v", phase, lambda: self._all_gather_bytes(buf, sizes))
        self.traffic.add(phase, (P - 1) * sizes[r], sum(s for j, s in enumerate(sizes) if j != r))
        if self.pads_all_gather:
            top = max(sizes)
            self.traffic.add(PAD, (P - 1) * (top - sizes[r]), sum(top - s for j, s in enumerate(sizes) if j != r))
        return [message if j == r else unpack(got[j], table[j][1:], message) for j in range(P)]
