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

The parts, one job each: zen.comm.wire (message layouts, headers' sizes, packing, the metadata a `predict`
adds), zen.comm.agreement (guarded calls, headers compared, the fixed all-gather), zen.comm.rounds (the
two-round exchanges), zen.comm.bounded (their one-round form under a bound); this module is the class they
make up, its state and its dense all-reduce. Their names are importable from here, as before.
"""

from __future__ import annotations

import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import torch

from zen.comm.pool import BufferPool
from zen.comm.rounds import Rounds
from zen.comm.wire import (
    FIXED_BYTES,
    FIXED_VALUES,
    HEAD_BYTES,
    META,
    PAD,
    Deferred,
    Message,
    Packed,
    code_of,
    count_meta,
    gather_meta,
    gather_v_meta,
    layout_code,
    message_bytes,
    message_meta,
    pack,
    ring_chunk,
    row_bytes,
    unpack,
)
from zen.types import Traffic

__all__ = ["FIXED_BYTES", "FIXED_VALUES", "HEAD_BYTES", "META", "PAD", "Communicator", "Deferred", "Message", "Packed",
           "Pending", "code_of", "count_meta", "gather_meta", "gather_v_meta", "layout_code", "message_bytes",
           "message_meta", "pack", "ring_chunk", "row_bytes", "unpack"]


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


class Communicator(Rounds, ABC):
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
        # this call's groups side by side on this rank's link, one rank of each (two-level sync's node, where every
        # shard group syncs rows): a scheme choosing its path from bytes predicts them together (zen's selector)
        self.shared_link: Communicator | None = None

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


    # ---- counted collectives -----------------------------------------------------------------
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

    def _wire_device(self) -> torch.device:
        """Where payload bytes are packed for the backend (gloo: the host, whatever the tensors' device)."""
        return self.device
