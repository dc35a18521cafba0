"""The one door to the network: every scheme talks through a Communicator, which counts bytes.

Messages are tuples of tensors whose first dimension varies per rank; each message travels as one
packed byte buffer, so a scheme phase costs one payload collective plus one small metadata exchange of
the per-tensor row counts. Backends (zen.comm.sim, zen.comm.dist) only move bytes (`_all_reduce`,
`_all_reduce_async`, `_all_gather`, `_all_to_all`, `_all_gather_bytes`, `_sendrecv`); the accounting
lives here, in the counted collectives, so the simulated group and torch.distributed count identically.

Byte conventions (what a rank sends to and receives from the others, never from itself), added to
`traffic` under the caller's phase:
- all_to_all_v / all_gather_v / sendrecv: exact payload bytes; the row counts that precede them are
  counted under the phase "meta".
- all_gather_fixed: (world_size - 1) * the tensor's bytes each way (phase "meta" unless given;
  shared_seed's under "setup").
- all_reduce / all_reduce_async: the ring algorithm's payload, 2 * (numel - own chunk) * itemsize each
  way (the async one counts when it is issued).
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from zen.types import Traffic, ZenCommError

Message = tuple[torch.Tensor, ...]
META = "meta"
T = TypeVar("T")


def ring_chunk(numel: int, world_size: int, rank: int) -> int:
    """Size of `rank`'s chunk when a ring all-reduce cuts `numel` elements into `world_size` pieces."""
    base, rem = divmod(numel, world_size)
    return base + (1 if rank < rem else 0)


def _pack(message: Message) -> tuple[torch.Tensor, list[int]]:
    flat = [t.contiguous().view(-1).view(torch.uint8) for t in message]
    buf = torch.cat(flat) if len(flat) > 1 else flat[0]
    return buf, [int(t.shape[0]) for t in message]


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
    def _guard(self, what: str, phase: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except ZenCommError:
            raise
        except Exception as exc:  # backend errors: dead peer, timeout, broken barrier
            raise ZenCommError(
                f"rank {self.rank}/{self.world_size}: {what} in phase '{phase}' failed "
                f"(dead or missing peer, timeout, or ranks calling different collectives): {exc}"
            ) from exc

    # ---- counted collectives -----------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, phase: str) -> torch.Tensor:
        """In-place dense sum over ranks."""
        if self.world_size > 1:
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
        own = ring_chunk(tensor.numel(), self.world_size, self.rank)
        nbytes = 2 * (tensor.numel() - own) * tensor.element_size()
        pending = self._guard("all_reduce", phase, lambda: self._all_reduce_async(tensor))
        self.traffic.add(phase, nbytes, nbytes)

        def settle(fut: torch.futures.Future) -> torch.Tensor:
            self._guard("all_reduce", phase, fut.value)
            return tensor

        return pending.then(settle)

    def all_gather_fixed(self, tensor: torch.Tensor, phase: str = META) -> torch.Tensor:
        """All-gather of a small tensor whose shape is identical on every rank."""
        if self.world_size == 1:
            return tensor.unsqueeze(0).clone()
        out = self._guard("all_gather", phase, lambda: self._all_gather(tensor))
        nbytes = (self.world_size - 1) * tensor.numel() * tensor.element_size()
        self.traffic.add(phase, nbytes, nbytes)
        return out

    def all_to_all_v(self, messages: list[Message], phase: str) -> list[Message]:
        """messages[j] goes to rank j; returns the message received from each rank, in rank order."""
        P, r = self.world_size, self.rank
        packed = [_pack(m) for m in messages]
        if P == 1:
            return [messages[0]]
        counts = torch.tensor([c for _, c in packed], dtype=torch.int64, device=self.device)
        recv_counts = self._count_exchange(counts, phase).tolist()
        template = messages[r]
        bufs = [b for b, _ in packed]
        row_bytes = _row_bytes(template)
        recv_sizes = [_message_bytes(rc, row_bytes) for rc in recv_counts]
        recv = self._guard("all_to_all_v", phase, lambda: self._all_to_all(bufs, recv_sizes))
        sent = sum(int(b.numel()) for j, b in enumerate(bufs) if j != r)
        self.traffic.add(phase, sent, sum(s for j, s in enumerate(recv_sizes) if j != r))
        return [
            messages[r] if j == r else _unpack(recv[j], recv_counts[j], template) for j in range(P)
        ]

    def _count_exchange(self, counts: torch.Tensor, phase: str) -> torch.Tensor:
        P = self.world_size
        width = counts.shape[1]
        bufs = [counts[j].view(torch.uint8) for j in range(P)]
        recv = self._guard(
            "all_to_all(counts)", phase, lambda: self._all_to_all(bufs, [8 * width] * P)
        )
        nbytes = (P - 1) * 8 * width
        self.traffic.add(META, nbytes, nbytes)
        return torch.stack([b.view(torch.int64) for b in recv]).cpu()

    def all_gather_v(self, message: Message, phase: str) -> list[Message]:
        """Every rank's message, in rank order (no padding: exact bytes)."""
        P, r = self.world_size, self.rank
        if P == 1:
            return [message]
        buf, counts = _pack(message)
        all_counts = self.all_gather_fixed(torch.tensor(counts, dtype=torch.int64, device=self.device))
        all_counts = all_counts.cpu().tolist()
        row_bytes = _row_bytes(message)
        sizes = [_message_bytes(rc, row_bytes) for rc in all_counts]
        recv = self._guard("all_gather_v", phase, lambda: self._all_gather_bytes(buf, sizes))
        self.traffic.add(phase, (P - 1) * sizes[r], sum(s for j, s in enumerate(sizes) if j != r))
        return [message if j == r else _unpack(recv[j], all_counts[j], message) for j in range(P)]

    def sendrecv(
        self, peer: int, send: Message | None, recv_like: Message | None, phase: str
    ) -> Message | None:
        """Send to and/or receive from one peer; sizes travel first as metadata."""
        buf, counts = _pack(send) if send is not None else (None, None)
        width = len(recv_like) if recv_like is not None else 0
        cnt_send = torch.tensor(counts, dtype=torch.int64, device=self.device) if counts is not None else None
        recv_cnt = self._guard(
            "sendrecv(counts)", phase,
            lambda: self._sendrecv(
                peer,
                cnt_send.view(torch.uint8) if cnt_send is not None else None,
                8 * width if recv_like is not None else None,
            ),
        )
        self.traffic.add(META, 8 * len(counts) if counts is not None else 0, 8 * width)
        recv_counts = recv_cnt.view(torch.int64).cpu().tolist() if recv_cnt is not None else None
        recv_size = None
        if recv_like is not None:
            recv_size = _message_bytes(recv_counts, _row_bytes(recv_like))
        rbuf = self._guard("sendrecv", phase, lambda: self._sendrecv(peer, buf, recv_size))
        self.traffic.add(phase, int(buf.numel()) if buf is not None else 0, recv_size or 0)
        if recv_like is None:
            return None
        return _unpack(rbuf, recv_counts, recv_like)

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
