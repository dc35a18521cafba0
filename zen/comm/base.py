"""The one door to the network: every scheme talks through a Communicator, which counts bytes.

Messages are tuples of tensors whose first dimension varies per rank; each message travels as one
packed byte buffer, so a scheme phase costs one payload collective plus one small header exchange.
Backends (zen.comm.sim, zen.comm.dist) only move bytes (`_all_reduce`, `_all_reduce_async`,
`_all_gather`, `_all_to_all`, `_all_gather_bytes`, `_sendrecv`); the accounting lives here, in the
counted collectives, so the simulated group and torch.distributed count identically.

Every size-carrying exchange starts with a fixed-size header that names the call (its number on this
communicator and a code of the scheme and its options, `begin_call`): a message's header (HEAD_BYTES per
peer: call, code, layout, the message's size on the wire) or a fixed all-gather (FIXED_SLOTS int64: call,
code, length, values). A message travels as its tensors' row counts, then their bytes; the receiver sizes
its buffer from the header, never from its own guess. Headers of one kind have one size, so two ranks
at different calls never post operations of the same kind with different sizes (gloo aborts the process
on that); they see each other's header instead, and every rank raises: ZenCommError when the call
numbers differ (a skipped or extra call), ZenInputError when codes or layouts differ (ranks configured
differently).

After a failure (a timeout, a dead peer, misaligned calls) the communicator is poisoned: that call and
every later one raise ZenCommError naming the first failure. Recover by re-creating the process group.

Byte conventions (what a rank sends to and receives from the others, never from itself), added to
`traffic` under the caller's phase:
- all_to_all_v / all_gather_v / sendrecv: exact payload bytes; headers and row counts under "meta".
- all_gather_fixed: (world_size - 1) * FIXED_SLOTS * 8 each way (phase "meta" unless given;
  shared_seed's under "setup").
- all_reduce / all_reduce_async: the ring algorithm's payload, 2 * (numel - own chunk) * itemsize each
  way (the async one counts when it is issued), plus a fixed all-gather of the size under "meta" when the
  call's sizes were not agreed beforehand.
"""

from __future__ import annotations

import math
import random
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from zen.types import Traffic, ZenCommError, ZenInputError

Message = tuple[torch.Tensor, ...]
META = "meta"
T = TypeVar("T")
HEAD_BYTES = 32  # a message's header, per peer: call, code, layout, wire bytes (4 int64)
COUNT_BYTES = 8  # one int64 row count per tensor, ahead of the tensors in a wire message
FIXED_SLOTS = 16  # a fixed all-gather: call, code, length, up to 13 values
FIXED_VALUES = FIXED_SLOTS - 3


def code_of(text: str) -> int:
    """A stable 32-bit code of a description (dtypes and shapes, a scheme and its options)."""
    return zlib.crc32(text.encode())


def _layout(template: Message) -> int:
    return code_of(";".join(f"{t.dtype}{tuple(t.shape[1:])}" for t in template))


def ring_chunk(numel: int, world_size: int, rank: int) -> int:
    """Size of `rank`'s chunk when a ring all-reduce cuts `numel` elements into `world_size` pieces."""
    base, rem = divmod(numel, world_size)
    return base + (1 if rank < rem else 0)


def _wire(message: Message) -> torch.Tensor:
    """A message as one byte buffer: each tensor's row count (int64), then the tensors' bytes."""
    counts = torch.tensor([int(t.shape[0]) for t in message], dtype=torch.int64)
    flat = [t.contiguous().view(-1).view(torch.uint8) for t in message]
    device = flat[0].device if flat else counts.device
    return torch.cat([counts.to(device).view(torch.uint8), *flat])


def _unpack(buf: torch.Tensor, counts: Sequence[int], template: Message) -> Message:
    """Rebuild a message from bytes, using the local message's dtypes and row shapes as template."""
    out, offset = [], 0
    for count, like in zip(counts, template, strict=True):
        row_shape = tuple(like.shape[1:])
        itemsize = like.element_size()
        nbytes = int(count) * itemsize * math.prod(row_shape)
        chunk = buf[offset : offset + nbytes].to(like.device)  # from the wire's device to the message's
        if chunk.storage_offset() % itemsize:
            chunk = chunk.clone()
        out.append(chunk.view(like.dtype).view(int(count), *row_shape))
        offset += nbytes
    return tuple(out)


def _row_bytes(template: Message) -> list[int]:
    """Bytes of one row (first-dim slice) of each tensor of a message."""
    return [t.element_size() * math.prod(t.shape[1:]) for t in template]


def _message_bytes(counts: Sequence[int], row_bytes: Sequence[int]) -> int:
    return sum(int(c) * b for c, b in zip(counts, row_bytes, strict=True))


class Communicator(ABC):
    """A rank's view of its group. Subclasses move bytes; this class counts them. `clocked`: whether wall
    times of its exchanges mean anything (not for simulated ranks sharing one process)."""

    clocked = True

    def __init__(self, rank: int, world_size: int, device: torch.device, seed: int | None = None):
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.traffic = Traffic()
        self._seed_proposal = seed
        self._seed: int | None = None
        self.call = 0  # calls begun on this communicator (the same on every rank while they agree)
        self._code = 0
        self._sizes_agreed = False
        self._failure: str | None = None

    def begin_call(self, code: int, sizes_agreed: bool = False) -> None:
        """Start the next call: its headers carry the call number and `code` (the scheme and its options).
        `sizes_agreed`: every rank's tensors are known to be alike (a passed input check, or DDP's verified
        buckets), so a dense all-reduce needs no size header."""
        self.call += 1
        self._code = code & 0x7FFFFFFF
        self._sizes_agreed = sizes_agreed

    @property
    def failure(self) -> str | None:
        """The first failure that poisoned this communicator, or None."""
        return self._failure

    # ---- backend primitives (bytes only, no accounting) -------------------------------------
    @abstractmethod
    def _all_reduce(self, tensor: torch.Tensor) -> None: ...

    def _all_reduce_async(self, tensor: torch.Tensor) -> torch.futures.Future:
        """A sum that completes later; backends that cannot overlap complete it before returning."""
        self._all_reduce(tensor)
        done: torch.futures.Future = torch.futures.Future()
        done.set_result(tensor)
        return done

    @abstractmethod
    def _all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Equal-size all-gather: returns a (world_size, *tensor.shape) tensor."""

    @abstractmethod
    def _all_to_all(self, bufs: list[torch.Tensor], recv_sizes: list[int]) -> list[torch.Tensor]: ...

    @abstractmethod
    def _all_gather_bytes(self, buf: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]: ...

    @abstractmethod
    def _sendrecv(
        self, peer: int, send: torch.Tensor | None, recv_size: int | None
    ) -> torch.Tensor | None: ...

    # ---- guarded execution -------------------------------------------------------------------
    def _poison(self, why: str) -> ZenCommError:
        if self._failure is None:
            self._failure = why
        return ZenCommError(why)

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

    # ---- counted collectives -----------------------------------------------------------------
    def _agree_size(self, tensor: torch.Tensor) -> None:
        """Unless the call's sizes are agreed: all ranks show each other the tensor's size and dtype first
        (a fixed all-gather), since gloo aborts a process whose all-reduce meets one of another size."""
        if not self._sizes_agreed:
            mine = torch.tensor([tensor.numel(), code_of(str(tensor.dtype))], dtype=torch.int64)
            table = self.all_gather_fixed(mine.to(self.device)).cpu().tolist()
            if len({tuple(row) for row in table}) > 1:
                raise ZenInputError(f"zen: rank {self.rank}/{self.world_size}: all_reduce of tensors that differ "
                                    f"across ranks (numel, dtype code per rank: {table})")

    def all_reduce(self, tensor: torch.Tensor, phase: str) -> torch.Tensor:
        """In-place dense sum over ranks."""
        if self.world_size > 1:
            self._agree_size(tensor)
            own = ring_chunk(tensor.numel(), self.world_size, self.rank)
            nbytes = 2 * (tensor.numel() - own) * tensor.element_size()
            self._guard("all_reduce", phase, lambda: self._all_reduce(tensor))
            self.traffic.add(phase, nbytes, nbytes)
        return tensor

    def all_reduce_async(self, tensor: torch.Tensor, phase: str) -> torch.futures.Future[torch.Tensor]:
        """`all_reduce` that returns at once; the future completes with `tensor` summed, or raises
        ZenCommError. Bytes are counted when it is issued (they do not depend on the outcome)."""
        if self.world_size == 1:
            done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
            done.set_result(tensor)
            return done
        self._agree_size(tensor)
        own = ring_chunk(tensor.numel(), self.world_size, self.rank)
        nbytes = 2 * (tensor.numel() - own) * tensor.element_size()
        pending = self._guard("all_reduce", phase, lambda: self._all_reduce_async(tensor))
        self.traffic.add(phase, nbytes, nbytes)

        def settle(fut: torch.futures.Future) -> torch.Tensor:
            self._guard("all_reduce", phase, fut.value)
            return tensor

        return pending.then(settle)

    def all_gather_fixed(self, tensor: torch.Tensor, phase: str = META) -> torch.Tensor:
        """All-gather of up to FIXED_VALUES 8-byte values, as many on every rank: a (P, *shape) table.
        It travels as one FIXED_SLOTS header (call, code, n, values), whatever n is."""
        n = int(tensor.numel())
        if n > FIXED_VALUES or tensor.element_size() != 8:
            raise ValueError(f"all_gather_fixed takes at most {FIXED_VALUES} 8-byte values, got {n} {tensor.dtype}")
        if self.world_size == 1:
            return tensor.unsqueeze(0).clone()
        head = torch.zeros(FIXED_SLOTS, dtype=torch.int64, device=tensor.device)
        head[:3] = torch.tensor([self.call, self._code, n])
        head[3 : 3 + n] = tensor.reshape(-1).view(torch.int64)
        table = self._guard("all_gather", phase, lambda: self._all_gather(head))
        nbytes = (self.world_size - 1) * FIXED_SLOTS * 8
        self.traffic.add(phase, nbytes, nbytes)
        self._agree(table[:, :3].cpu().tolist(), list(range(self.world_size)), f"all_gather in phase '{phase}'")
        return table[:, 3 : 3 + n].contiguous().view(tensor.dtype).reshape(self.world_size, *tensor.shape)

    def all_to_all_v(self, messages: list[Message], phase: str) -> list[Message]:
        """messages[j] goes to rank j; returns the message received from each rank, in rank order."""
        P, r = self.world_size, self.rank
        if P == 1:
            return [messages[0]]
        template = messages[r]
        bufs = [_wire(m) for m in messages]
        heads = torch.tensor([[self.call, self._code, _layout(template), int(b.numel())] for b in bufs],
                             dtype=torch.int64, device=self.device)
        recv = self._guard("all_to_all(headers)", phase,
                           lambda: self._all_to_all(list(heads.view(torch.uint8).view(P, -1)), [HEAD_BYTES] * P))
        table = torch.stack([b.view(torch.int64) for b in recv]).cpu().tolist()
        self.traffic.add(META, (P - 1) * HEAD_BYTES, (P - 1) * HEAD_BYTES)
        self._agree([row[:3] for row in table], list(range(P)), f"all_to_all_v in phase '{phase}'")
        sizes = [row[3] for row in table]
        got = self._guard("all_to_all_v", phase, lambda: self._all_to_all(bufs, sizes))
        self._count(phase, template, sum(int(b.numel()) for j, b in enumerate(bufs) if j != r),
                    sum(s for j, s in enumerate(sizes) if j != r), P - 1)
        return [template if j == r else self._unwire(got[j], template, phase) for j in range(P)]

    def all_gather_v(self, message: Message, phase: str) -> list[Message]:
        """Every rank's message, in rank order (no padding: exact bytes)."""
        P, r = self.world_size, self.rank
        if P == 1:
            return [message]
        buf = _wire(message)
        mine = torch.tensor([_layout(message), int(buf.numel())], dtype=torch.int64, device=self.device)
        table = self.all_gather_fixed(mine).cpu().tolist()
        if len({row[0] for row in table}) > 1:
            raise ZenInputError(f"zen: rank {r}/{P}: all_gather_v in phase '{phase}': ranks send different "
                                f"dtypes or row shapes in call {self.call}")
        sizes = [row[1] for row in table]
        got = self._guard("all_gather_v", phase, lambda: self._all_gather_bytes(buf, sizes))
        self._count(phase, message, (P - 1) * sizes[r], sum(s for j, s in enumerate(sizes) if j != r), P - 1)
        return [message if j == r else self._unwire(got[j], message, phase) for j in range(P)]

    def sendrecv(
        self, peer: int, send: Message | None, recv_like: Message | None, phase: str
    ) -> Message | None:
        """Send to and/or receive from one peer; a fixed header with the size travels first."""
        buf = _wire(send) if send is not None else None
        head = None
        if send is not None and buf is not None:
            head = torch.tensor([self.call, self._code, _layout(send), int(buf.numel())], dtype=torch.int64,
                                device=self.device).view(torch.uint8)
        got_head = self._guard("sendrecv(header)", phase,
                               lambda: self._sendrecv(peer, head, HEAD_BYTES if recv_like is not None else None))
        self.traffic.add(META, HEAD_BYTES if send is not None else 0, HEAD_BYTES if recv_like is not None else 0)
        size = None
        if recv_like is not None:
            theirs = got_head.view(torch.int64).cpu().tolist()
            mine = [self.call, self._code, _layout(recv_like)]
            self._agree([mine, theirs[:3]], [self.rank, peer], f"sendrecv in phase '{phase}'", fatal=True)
            size = theirs[3]
        got = self._guard("sendrecv", phase, lambda: self._sendrecv(peer, buf, size))
        sent = int(buf.numel()) if buf is not None else 0
        if send is not None:
            self._count(phase, send, sent, 0, 1)
        if recv_like is None:
            return None
        self._count(phase, recv_like, 0, size or 0, 1)
        return self._unwire(got, recv_like, phase)

    def _count(self, phase: str, template: Message, sent: int, received: int, messages: int) -> None:
        """Add the wire bytes of `messages` messages each way: their row counts under META, the rest under
        `phase` (what `predict` counts as payload)."""
        counts = COUNT_BYTES * len(template) * messages
        self.traffic.add(META, counts if sent else 0, counts if received else 0)
        self.traffic.add(phase, sent - counts if sent else 0, received - counts if received else 0)

    def _unwire(self, buf: torch.Tensor, template: Message, phase: str) -> Message:
        """A received wire message (row counts, then the packed tensors) as tensors shaped like `template`."""
        prefix = COUNT_BYTES * len(template)
        head = buf[:prefix].clone() if buf.storage_offset() % COUNT_BYTES else buf[:prefix]
        counts = head.view(torch.int64).cpu().tolist()
        if prefix + _message_bytes(counts, _row_bytes(template)) != buf.numel():
            raise self._poison(f"rank {self.rank}/{self.world_size}: a message in phase '{phase}' does not "
                               f"match its header ({buf.numel()} bytes for row counts {counts})")
        return _unpack(buf[prefix:], counts, template)

    # ---- start-up agreement ------------------------------------------------------------------
    def shared_seed(self) -> int:
        """A seed every rank agrees on (rank 0's proposal), fetched once per communicator."""
        if self._seed is None:
            proposal = self._seed_proposal
            if proposal is None:
                proposal = random.SystemRandom().getrandbits(62)
            mine = torch.tensor([proposal], dtype=torch.int64, device=self.device)
            self._seed = int(self.all_gather_fixed(mine, phase="setup")[0, 0])
        return self._seed
