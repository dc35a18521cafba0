"""The one door to the network: every scheme talks through a Communicator, which counts bytes.

Messages are tuples of tensors whose first dimension varies per rank. A size-carrying exchange is two
rounds: a fixed-size header per peer first, then the payload, sized from the header (never from the
receiver's guess). Where the receiver knows a bound on the message (`bound`: rows per tensor a sender may
send, which a scheme derives from the row counts every rank announced in this call's input check,
`announce`) and the backend takes a message shorter than the posted receive (`short_receives`: gloo), it is
one round instead: each message travels with its header in front, into a receive of the bound's size. A
sender never exceeds the bound it is given (it raises first): gloo aborts a process that meets a longer one.

The header names the call (its number on this communicator and a code of the scheme and its options, `begin_call`),
the message's layout (dtypes and row shapes) and each tensor's row count, so the receiver reads ONE small table per
round on the host and nothing of the payload: on a GPU that is the round's only host synchronization, and it is
counted (`Traffic.host_reads`; `host` is the only way this layer reads device data). Headers of one kind have one
size, so ranks at different calls never post operations of the same kind with different sizes (gloo aborts the
process on that); they see each other's header instead, and every rank raises: ZenCommError when the call numbers
differ (a skipped or extra call), ZenInputError when codes or layouts differ (ranks configured differently).

Every exchange is a round of the whole group: every rank calls it, also a rank with nothing to send (an
empty `exchange`), in the same order on every rank. Backends (zen.comm.sim, zen.comm.dist) only move bytes
(`_all_reduce`, `_all_reduce_async`, `_all_gather`, `_all_to_all`, `_all_gather_bytes`); the accounting
lives here, so the simulated group and torch.distributed count identically.

After a failure (a timeout, a dead peer, misaligned calls) the communicator is poisoned: that call and
every later one raise ZenCommError naming the first failure. Recover by re-creating the process group.

Byte conventions (what a rank sends to and receives from the others, never from itself), added to
`traffic` under the caller's phase:
- exchange / all_to_all_v / all_gather_v: exact payload bytes; headers under "meta" (HEAD_BYTES per
  message and peer; an all_gather_v's header is one fixed all-gather). A backend whose all-gather needs
  equal sizes (NCCL) pads every rank's message to the largest: the padding is counted under "pad".
- all_gather_fixed: (world_size - 1) * FIXED_SLOTS * 8 each way (phase "meta" unless given;
  shared_seed's under "setup").
- all_reduce / all_reduce_async: the ring algorithm's payload, 2 * (numel - own chunk) * itemsize each
  way (the async one counts when it is issued), plus a fixed all-gather of the size under "meta" when the
  call's sizes were not agreed beforehand.
"""

from __future__ import annotations

import math
import random
import weakref
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from zen.comm.pool import BufferPool, span
from zen.types import Traffic, ZenCommError, ZenInputError

Message = tuple[torch.Tensor, ...]
META = "meta"
PAD = "pad"
T = TypeVar("T")
MAX_TENSORS = 5  # tensors per message: their row counts ride in the header
HEAD_SLOTS = 3 + MAX_TENSORS  # a message's header, per peer: call, code, layout, row counts (int64)
HEAD_BYTES = 8 * HEAD_SLOTS
FIXED_SLOTS = 16  # a fixed all-gather: call, code, length, up to 13 values
FIXED_VALUES = FIXED_SLOTS - 3
FIXED_BYTES = 8 * FIXED_SLOTS  # one rank's part of a fixed all-gather


def code_of(text: str) -> int:
    """A stable 32-bit code of a description (dtypes and shapes, a scheme and its options)."""
    return zlib.crc32(text.encode())


def layout_code(template: Message) -> int:
    """What sender and receiver must agree on about a message: its tensors' dtypes and row shapes."""
    return code_of(";".join(f"{t.dtype}{tuple(t.shape[1:])}" for t in template))


def ring_chunk(numel: int, world_size: int, rank: int) -> int:
    """Size of `rank`'s chunk when a ring all-reduce cuts `numel` elements into `world_size` pieces."""
    base, rem = divmod(numel, world_size)
    return base + (1 if rank < rem else 0)


def row_bytes(template: Message) -> list[int]:
    """Bytes of one row (first-dim slice) of each tensor of a message."""
    return [t.element_size() * math.prod(t.shape[1:]) for t in template]


def message_bytes(counts: Sequence[int], widths: Sequence[int]) -> int:
    return sum(int(c) * b for c, b in zip(counts, widths, strict=True))


def _offsets(counts: Sequence[int]) -> list[int]:
    bounds = [0]
    for c in counts:
        bounds.append(bounds[-1] + int(c))
    return bounds


def _lines(nbytes: int) -> int:
    """`nbytes` rounded up to whole 64-byte lines."""
    return -(-nbytes // 64) * 64


def _check_template(template: Message) -> None:
    if not 1 <= len(template) <= MAX_TENSORS:
        raise ValueError(f"a message holds 1 to {MAX_TENSORS} tensors, got {len(template)}")


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.uint8)


def pack(messages: Sequence[Message], device: torch.device, pool: BufferPool) -> torch.Tensor:
    """Messages back to back as one byte buffer on `device` taken from `pool` (one copy of each tensor, none of a
    lone tensor already there, nor of tensors already back to back in one buffer)."""
    flat = [_bytes_of(t) for m in messages for t in m if t.numel()]
    if flat and flat[0].device == device and (whole := flat[0] if len(flat) == 1 else span(flat)) is not None:
        return whole  # parts written back to back (HC's union and its codes) go as they lie
    buf = pool.take(sum(t.numel() for t in flat), device)
    offset = 0
    for t in flat:
        buf[offset : offset + t.numel()].copy_(t)
        offset += t.numel()
    return buf


def unpack(buf: torch.Tensor, counts: Sequence[int], template: Message) -> Message:
    """A message rebuilt from its bytes, shaped and typed like `template`, on the template's device (views of
    `buf` where the alignment allows)."""
    out, offset = [], 0
    for count, like, width in zip(counts, template, row_bytes(template), strict=True):
        nbytes = int(count) * width
        chunk = buf[offset : offset + nbytes].to(like.device)
        if chunk.storage_offset() % like.element_size():
            chunk = chunk.clone()
        out.append(chunk.view(like.dtype).view(int(count), *like.shape[1:]))
        offset += nbytes
    return tuple(out)


@dataclass
class Packed:
    """A message to every rank, laid out back to back: tensor t holds rank 0's rows, then rank 1's, ...;
    `counts` (rows per destination, on the host or still on the device) says how many. Saves a scheme from
    reading its partition sizes before the header round does (BP's hashed partitions): after the round,
    `rows` holds them on the host."""

    tensors: Message
    counts: torch.Tensor | Sequence[int]
    rows: list[int] | None = None


@dataclass
class Deferred:
    """Messages to `peers` (default: every other rank) whose sizes are still on the device, built only once
    the header round has read them: `counts` is (P, C), its first len(template) columns the rows of each
    tensor per destination (they go in the headers), any further columns read with them but not sent.
    `build(rows)`, rows[j] those C numbers for rank j on the host, returns the P messages (our own at our
    rank; others ignored for non-peers). Saves a scheme a host read of its cut points before the round:
    afterwards `rows` holds them."""

    template: Message
    counts: torch.Tensor
    build: Callable[[list[list[int]]], list[Message]]
    peers: Sequence[int] | None = None
    rows: list[list[int]] | None = None


class Pending:
    """An issued all-reduce: `future` completes with the tensor once its data can be read, on the host and on any
    stream that waits on the future (gloo's own future; on NCCL one the communicator completes once the work
    has run, zen.comm.completion)."""

    def __init__(self, tensor: torch.Tensor, future: torch.futures.Future):
        self.tensor = tensor
        self.future = future

    def wait(self) -> torch.Tensor:
        self.future.wait()
        return self.tensor

    def then(self, fn: Callable[[torch.Tensor], object]) -> Pending:
        """The same collective with `fn(tensor)` applied once its result is visible (a DDP mean's division)."""
        def step(fut: torch.futures.Future) -> torch.Tensor:
            fn(fut.value())
            return self.tensor

        return Pending(self.tensor, future=self.future.then(step))


class Communicator(ABC):
    """A rank's view of its group. Subclasses move bytes; this class counts them. `clocked`: whether wall
    times of its exchanges mean anything (not for simulated ranks sharing one process). `device`: where the
    payload tensors live."""

    clocked = True
    pads_all_gather = False  # True: an uneven all-gather travels padded to its largest message (NCCL)
    short_receives = False  # True: a message may be shorter than its posted receive (gloo): one-round exchanges

    def __init__(self, rank: int, world_size: int, device: torch.device, seed: int | None = None):
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.traffic = Traffic()
        self.pool = BufferPool()  # host wire buffers kept between calls (zen.comm.pool)
        self._seed_proposal = seed
        self._seed: int | None = None
        self.call = 0  # calls begun on this communicator (the same on every rank while they agree)
        self._code = 0
        self._sizes_agreed = False
        self._failure: str | None = None
        self._announced: dict[int, tuple[weakref.ref, list[int]]] = {}  # id(grad) -> (it, rows per rank), this call

    def begin_call(self, code: int, sizes_agreed: bool = False) -> None:
        """Start the next call: its headers carry the call number and `code` (the scheme and its options).
        `sizes_agreed`: every rank's tensors are known to be alike (a passed input check, or DDP's verified
        buckets), so a dense all-reduce needs no size header."""
        self.call += 1
        self._code = code & 0x7FFFFFFF
        self._sizes_agreed = sizes_agreed
        self._announced.clear()

    @property
    def sizes_agreed(self) -> bool:
        """Whether this call's tensors are known alike on every rank (`begin_call`)."""
        return self._sizes_agreed

    def announce(self, grad: object, rows: Sequence[int]) -> None:
        """Every rank's row count of `grad` (its `rows()`) as this call's input check all-gathered them, or an upper
        bound on each (two-level sync's shards, zen.twolevel; the tensor's rows where sizes are agreed and no check
        ran, zen.core): what a scheme may bound its messages by (`announced`).
        Forgotten when the next call begins; held weakly, so the communicator keeps no caller's tensor alive between
        calls."""
        self._announced[id(grad)] = (weakref.ref(grad), [int(c) for c in rows])

    def announced(self, grad: object) -> list[int] | None:
        """The row counts announced for `grad` on this communicator in this call, by rank, or None."""
        got = self._announced.get(id(grad))
        return got[1] if got is not None and got[0]() is grad else None

    @property
    def failure(self) -> str | None:
        """The first failure that poisoned this communicator, or None."""
        return self._failure

    # ---- backend primitives (bytes only, no accounting) -------------------------------------
    @abstractmethod
    def _all_reduce(self, tensor: torch.Tensor) -> None: ...

    def _all_reduce_async(self, tensor: torch.Tensor) -> Pending:
        """A sum that completes later; backends that cannot overlap complete it before returning."""
        self._all_reduce(tensor)
        done: torch.futures.Future = torch.futures.Future()
        done.set_result(tensor)
        return Pending(tensor, future=done)

    @abstractmethod
    def _all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Equal-size all-gather: returns a (world_size, *tensor.shape) tensor."""

    @abstractmethod
    def _all_to_all(self, send: torch.Tensor, send_sizes: list[int], recv_sizes: list[int]) -> torch.Tensor:
        """Bytes send[segment j] to rank j, in rank order; returns what came, segments in rank order. Every
        rank calls it; a zero size means no message to or from that rank."""

    @abstractmethod
    def _all_gather_bytes(self, buf: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
        """Every rank's byte buffer (`sizes[j]` bytes from rank j), in rank order."""

    # ---- host reads ----------------------------------------------------------------------------
    def host(self, tensor: torch.Tensor) -> list[Any]:
        """`tensor` as Python numbers: this layer's only read of (possibly device) data, counted once per
        call as a host read (on a GPU: a wait for this thread's stream)."""
        self.traffic.host_reads += 1
        return tensor.tolist()

    # ---- guarded execution -------------------------------------------------------------------
    def _poison(self, why: str) -> ZenCommError:
        if self._failure is None:
            self._failure = why
            self._on_failure()
        return ZenCommError(why)

    def _on_failure(self) -> None:  # noqa: B027 - a hook with nothing to do by default
        """What a backend does when the communicator fails (NCCL: abort, so no kernel waits forever)."""

    def _guard(self, what: str, phase: str, fn: Callable[[], T]) -> T:
        if self._failure is not None:
            raise ZenCommError(f"rank {self.rank}/{self.world_size}: {what} in phase '{phase}' refused: this "
                               f"communicator failed earlier ({self._failure}); re-create the process group")
        try:
            return fn()
        except ZenCommError as exc:
            raise self._poison(str(exc)) from exc
        except Exception as exc:  # backend errors: dead peer, timeout, broken barrier
            raise self._poison(
                f"rank {self.rank}/{self.world_size}: {what} in phase '{phase}' failed "
                f"(dead or missing peer, timeout, or ranks calling different collectives): {exc}"
            ) from exc

    def _agree(self, heads: list[list[int]], ranks: list[int], what: str, fatal: bool = False) -> None:
        """Raise, alike on every rank that sees the same headers, unless [call, code, layout] agree. `fatal`
        (a point-to-point header, which only the receiver sees): any disagreement poisons."""
        calls, codes, layouts = ([h[k] for h in heads] for k in range(3))
        where = f"rank {self.rank}/{self.world_size}: {what}"
        if fatal and (len(set(calls)) > 1 or len(set(codes)) > 1 or len(set(layouts)) > 1):
            raise self._poison(f"{where}: rank {ranks[1]} sent a message of another call, scheme or layout "
                               f"(call, code, layout: {heads[1]} here {heads[0]}); re-create the process group")
        if len(set(calls)) > 1:
            raise self._poison(f"{where}: calls are misaligned (ranks {ranks} are at calls {calls}): a rank "
                               f"skipped or added a call; re-create the process group")
        if len(set(codes)) > 1:
            raise ZenInputError(f"zen: {where}: ranks {ranks} run different schemes, options or validate "
                                f"settings in call {calls[0]} (codes {codes})")
        if len(set(layouts)) > 1:
            raise ZenInputError(f"zen: {where}: ranks {ranks} send different dtypes or row shapes in call "
                                f"{calls[0]}")

    def _stamp(self, template: Message) -> list[int]:
        """A message header's first slots: this call's number and code, and the message's layout."""
        return [self.call, self._code, layout_code(template)]

    def _header_rows(self, row: list[int], like: Message, source: int, phase: str) -> list[int]:
        """The row counts in rank `source`'s message header `row`, once its call, code and layout agree with ours."""
        self._agree([self._stamp(like), row[:3]], [self.rank, source], f"exchange in phase '{phase}'", fatal=True)
        return row[3 : 3 + len(like)]

    def _same_layouts(self, layouts: set[int], phase: str) -> None:
        """Raise, on every rank that sees the same layouts, unless every rank's all_gather_v message has one."""
        if len(layouts) > 1:
            raise ZenInputError(f"zen: rank {self.rank}/{self.world_size}: all_gather_v in phase '{phase}': ranks "
                                f"send different dtypes or row shapes in call {self.call}")

    # ---- counted collectives -----------------------------------------------------------------
    def _agree_size(self, tensor: torch.Tensor) -> None:
        """Unless the call's sizes are agreed: all ranks show each other the tensor's size and dtype first
        (a fixed all-gather), since gloo aborts a process whose all-reduce meets one of another size."""
        if not self._sizes_agreed:
            table = self.all_gather_fixed([tensor.numel(), code_of(str(tensor.dtype))])
            if len({tuple(row) for row in table}) > 1:
                raise ZenInputError(f"zen: rank {self.rank}/{self.world_size}: all_reduce of tensors that differ "
                                    f"across ranks (numel, dtype code per rank: {table})")

    def _ring_bytes(self, tensor: torch.Tensor) -> int:
        own = ring_chunk(tensor.numel(), self.world_size, self.rank)
        return 2 * (tensor.numel() - own) * tensor.element_size()

    def all_reduce(self, tensor: torch.Tensor, phase: str) -> torch.Tensor:
        """In-place dense sum over ranks."""
        if self.world_size > 1:
            self._agree_size(tensor)
            self._guard("all_reduce", phase, lambda: self._all_reduce(tensor))
            nbytes = self._ring_bytes(tensor)
            self.traffic.add(phase, nbytes, nbytes)
        return tensor

    def all_reduce_async(self, tensor: torch.Tensor, phase: str) -> Pending:
        """`all_reduce` that returns at once (`Pending`); its failure raises ZenCommError from the future or
        the wait. Bytes are counted when it is issued (they do not depend on the outcome)."""
        if self.world_size == 1:
            done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
            done.set_result(tensor)
            return Pending(tensor, future=done)
        self._agree_size(tensor)
        pending = self._guard("all_reduce", phase, lambda: self._all_reduce_async(tensor))
        nbytes = self._ring_bytes(tensor)
        self.traffic.add(phase, nbytes, nbytes)
        def settle(fut: torch.futures.Future) -> torch.Tensor:
            self._guard("all_reduce", phase, fut.value)
            return tensor

        return Pending(tensor, future=pending.future.then(settle))

    def all_gather_fixed(self, values: torch.Tensor | Sequence[int], phase: str = META,
                         dtype: torch.dtype = torch.int64) -> list[list[Any]]:
        """All-gather of up to FIXED_VALUES 8-byte values per rank (as many on every rank): every rank's
        values, as Python numbers of `dtype` (int64 or float64), in rank order. `values` may be a device
        tensor (counts a scheme has not read yet): the gathered table is read once, on the host. It travels
        as one FIXED_SLOTS header (call, code, n, values), whatever n is."""
        if isinstance(values, torch.Tensor):
            tensor = values.reshape(-1)
            if tensor.element_size() != 8:
                raise ValueError(f"all_gather_fixed takes 8-byte values, got {tensor.dtype}")
            tensor = tensor.view(torch.int64)
        else:
            tensor = torch.tensor(list(values), dtype=torch.int64)
        n = int(tensor.numel())
        if n > FIXED_VALUES:
            raise ValueError(f"all_gather_fixed takes at most {FIXED_VALUES} values, got {n}")
        head = torch.zeros(FIXED_SLOTS, dtype=torch.int64)
        head[:3] = torch.tensor([self.call, self._code, n])
        head = head.to(self.device)
        head[3 : 3 + n] = tensor.to(self.device)
        if self.world_size == 1:
            table = head.view(1, -1)
        else:
            table = self._guard("all_gather", phase, lambda: self._all_gather(head))
            nbytes = (self.world_size - 1) * FIXED_SLOTS * 8
            self.traffic.add(phase, nbytes, nbytes)
        self.traffic.rounds += 1
        rows = self.host(table)
        self._agree([row[:3] for row in rows], list(range(self.world_size)), f"all_gather in phase '{phase}'")
        if dtype == torch.int64:
            return [row[3 : 3 + n] for row in rows]
        return torch.tensor([row[3 : 3 + n] for row in rows], dtype=torch.int64).view(dtype).tolist()

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
                messages.rows, bounds = rows, _offsets(rows)
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
            bounds.extend(_offsets(rows))
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
        P, r = self.world_size, self.rank
        for m in (*sends.values(), *recvs.values()):
            _check_template(m)
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
        received: dict[int, list[int]] = {}
        for i, j in enumerate(sources):
            received[j] = self._header_rows(flat[i * HEAD_SLOTS : (i + 1) * HEAD_SLOTS], recvs[j], j, phase)
        messages = payload(mine)
        sizes_out = [0] * P
        for j, m in zip(sorted(sends), messages, strict=True):
            sizes_out[j] = sum(t.numel() * t.element_size() for t in m)
        sizes_in = [message_bytes(received[j], row_bytes(recvs[j])) if j in received else 0 for j in range(P)]
        buf = pack(messages, self._wire_device(), self.pool)
        got = self._guard("exchange", phase, lambda: self._all_to_all(buf, sizes_out, sizes_in))
        if sends or recvs:
            self.traffic.add(phase, sum(sizes_out), sum(sizes_in))
        out, offset = {}, 0
        for j in sources:
            out[j] = unpack(got[offset : offset + sizes_in[j]], received[j], recvs[j])
            offset += sizes_in[j]
        return out

    def _bounded_round(self, sends: Mapping[int, Message], counts: Mapping[int, list[int]],
                       recvs: Mapping[int, Message], phase: str, bound: Callable[[int], Sequence[int]]
                       ) -> dict[int, Message]:
        """`_round` in one round: every message goes with its header in front, into a receive of the bound's size
        (each starting on a 64-byte line, so its tensors are views). Bytes are counted as in `_round`."""
        P, r = self.world_size, self.rank
        for m in (*sends.values(), *recvs.values()):
            _check_template(m)
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
        sizes_in = [_lines(HEAD_BYTES + message_bytes(limits[j], row_bytes(recvs[j]))) if j in recvs else 0
                    for j in range(P)]
        buf = pack(messages, self._wire_device(), self.pool)
        got = self._guard("exchange", phase, lambda: self._all_to_all(buf, sizes_out, sizes_in))
        starts = _offsets(sizes_in)
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

    def _wire_device(self) -> torch.device:
        """Where payload bytes are packed for the backend (gloo: the host, whatever the tensors' device)."""
        return self.device

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
        _check_template(message)
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
                 _lines(FIXED_BYTES + message_bytes([int(b) for b in bound(j)], widths)) for j in range(P)]
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

    # ---- start-up agreement ------------------------------------------------------------------
    def shared_seed(self) -> int:
        """A seed every rank agrees on (rank 0's proposal), fetched once per communicator."""
        if self._seed is None:
            proposal = self._seed_proposal
            if proposal is None:
                proposal = random.SystemRandom().getrandbits(62)
            self._seed = int(self.all_gather_fixed([proposal], phase="setup")[0][0])
        return self._seed


# ---- metadata a rank receives (what `predict`s add to a scheme's payload) ------------------------


def message_meta() -> int:
    """Metadata of one message received from one peer: its header (call, code, layout, row counts)."""
    return HEAD_BYTES


def count_meta(world_size: int) -> int:
    """Metadata received in an all_to_all_v (one message per peer)."""
    return (world_size - 1) * message_meta()


def gather_meta(world_size: int) -> int:
    """What one fixed all-gather brings (the input check, a scheme's small agreement)."""
    return (world_size - 1) * FIXED_BYTES


def gather_v_meta(world_size: int) -> int:
    """Metadata received in an all_gather_v: its fixed all-gather of layouts and row counts."""
    return (world_size - 1) * FIXED_BYTES
