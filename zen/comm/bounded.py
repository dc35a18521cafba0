"""One-round exchanges: where every rank knows a bound on each message (`bound`: rows per tensor a sender may
send, from the row counts the call's input check announced) and the backend takes a message shorter than its
posted receive (gloo), each message travels with its header in front, into a receive of the bound's size (each
starting on a 64-byte line, so its tensors are views). A sender over its bound raises before sending (gloo aborts
a process that meets a longer message). The same bytes are counted as in the two-round form (zen.comm.rounds)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from zen.comm.agreement import Agreement
from zen.comm.pool import BufferPool
from zen.comm.wire import (
    FIXED_BYTES,
    FIXED_SLOTS,
    HEAD_BYTES,
    HEAD_SLOTS,
    META,
    Message,
    check_template,
    layout_code,
    message_bytes,
    offsets,
    on_lines,
    pack,
    row_bytes,
    unpack,
)


class BoundedRounds(Agreement):
    """The one-round exchange and all-gather of zen.comm.base.Communicator."""

    pool: BufferPool
    _all_to_all: Callable[[torch.Tensor, list[int], list[int]], torch.Tensor]
    _all_gather_bytes: Callable[[torch.Tensor, list[int]], list[torch.Tensor]]
    _wire_device: Callable[[], torch.device]

    def _bounded_round(self, sends: Mapping[int, Message], counts: Mapping[int, list[int]],
                       recvs: Mapping[int, Message], phase: str, bound: Callable[[int], Sequence[int]]
                       ) -> dict[int, Message]:
        """`_round` in one round: every message goes with its header in front, into a receive of the bound's size
        (each starting on a 64-byte line, so its tensors are views). Bytes are counted as in `_round`."""
        P, r = self.world_size, self.rank
        for m in (*sends.values(), *recvs.values()):
            check_template(m)
        ours = [int(b) for b in bound(r)]
        messages, sizes_out = [], [0] * P
        for j in sorted(sends):
            m, rows = sends[j], counts[j]
            if any(c > b for c, b in zip(rows, ours, strict=True)):
                raise ValueError(f"rank {r}: a message of {rows} rows to rank {j} exceeds its bound {ours}")
            head = torch.zeros(HEAD_SLOTS, dtype=torch.int64)
            head[: 3 + len(m)] = torch.tensor([*self._stamp(m), *rows])
            messages.append((head, *m))
            sizes_out[j] = HEAD_BYTES + message_bytes(rows, row_bytes(m))
        limits = {j: [int(b) for b in bound(j)] for j in recvs}
        sizes_in = [on_lines(HEAD_BYTES + message_bytes(limits[j], row_bytes(recvs[j]))) if j in recvs else 0
                    for j in range(P)]
        buf = pack(messages, self._wire_device(), self.pool)
        got = self._guard("exchange", phase, lambda: self._all_to_all(buf, sizes_out, sizes_in))
        starts = offsets(sizes_in)
        sources = [j for j in range(P) if j in recvs]
        heads = [got[starts[j] : starts[j] + HEAD_BYTES].view(torch.int64) for j in sources]
        flat = self.host(torch.cat(heads)) if heads else []
        out, received = {}, 0
        for i, j in enumerate(sources):
            like, start = recvs[j], starts[j] + HEAD_BYTES
            rows = self._header_rows(flat[i * HEAD_SLOTS : (i + 1) * HEAD_SLOTS], like, j, phase)
            nbytes = message_bytes(rows, row_bytes(like))
            out[j] = unpack(got[start : start + nbytes], rows, like)
            received += nbytes
        if sends or recvs:
            self.traffic.add(META, HEAD_BYTES * len(sends), HEAD_BYTES * len(sources))
            self.traffic.add(phase, sum(sizes_out) - HEAD_BYTES * len(sends), received)
            self.traffic.rounds += 1
        return out

    def _bounded_gather(self, message: Message, phase: str, bound: Callable[[int], Sequence[int]]) -> list[Message]:
        """`all_gather_v` in one round: the fixed all-gather's row (call, code, its length, the layout, the row
        counts) goes in front of the payload, into receives of the bound's size on 64-byte lines; the same bytes
        are counted."""
        P, r = self.world_size, self.rank
        counts, widths = [int(t.shape[0]) for t in message], row_bytes(message)
        ours = [int(b) for b in bound(r)]
        if any(c > b for c, b in zip(counts, ours, strict=True)):
            raise ValueError(f"rank {r}: all_gather_v of {counts} rows exceeds its bound {ours}")
        head = torch.zeros(FIXED_SLOTS, dtype=torch.int64)
        head[: 4 + len(counts)] = torch.tensor([self.call, self._code, 1 + len(counts), layout_code(message), *counts])
        buf = pack([(head, *message)], self._wire_device(), self.pool)
        sizes = [int(buf.numel()) if j == r else
                 on_lines(FIXED_BYTES + message_bytes([int(b) for b in bound(j)], widths)) for j in range(P)]
        got = self._guard("all_gather_v", phase, lambda: self._all_gather_bytes(buf, sizes))
        rows = self.host(torch.cat([got[j][:FIXED_BYTES].view(torch.int64) for j in range(P)]))
        rows = [rows[j * FIXED_SLOTS : (j + 1) * FIXED_SLOTS] for j in range(P)]
        self._agree([row[:3] for row in rows], list(range(P)), f"all_gather_v in phase '{phase}'")
        self._same_layouts({row[3] for row in rows}, phase)
        out, received = [], 0
        for j in range(P):
            got_rows = rows[j][4 : 4 + len(message)]
            nbytes = message_bytes(got_rows, widths)
            out.append(message if j == r else unpack(got[j][FIXED_BYTES : FIXED_BYTES + nbytes], got_rows, message))
            received += nbytes if j != r else 0
        self.traffic.add(META, (P - 1) * FIXED_BYTES, (P - 1) * FIXED_BYTES)
        self.traffic.add(phase, (P - 1) * message_bytes(counts, widths), received)
        self.traffic.rounds += 1
        return out
