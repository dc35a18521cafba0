"""In-process simulated group: P virtual ranks as threads running the SAME scheme code, no sockets.

Collectives rendezvous on a barrier and hand tensors over by reference; point-to-point messages
go through per-pair queues. Any rank's exception aborts the group, so a failing rank can never
leave the others waiting; a collective that nobody answers times out.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import torch

from zen.comm.base import Communicator
from zen.types import ZenCommError


class SimGroup:
    """Shared rendezvous state of P virtual ranks."""

    def __init__(self, world_size: int, timeout_s: float = 600.0, seed: int | None = None):
        if world_size < 1:
            raise ValueError(f"world size must be >= 1, got {world_size}")
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.seed = seed
        self.barrier = threading.Barrier(world_size, timeout=timeout_s)
        self.slots: list[Any] = [None] * world_size
        self._mail: dict[tuple[int, int], queue.Queue] = {}
        self._lock = threading.Lock()
        self._subgroups: list[SimGroup] = []

    def subgroup(self, size: int) -> SimGroup:
        """A group of `size` of these ranks (a node, or one local rank of every node; the caller maps ranks):
        made before `run`, aborted with this group, so a failing rank frees the waiters of every sub-group."""
        child = SimGroup(size, self.timeout_s, self.seed)
        self._subgroups.append(child)
        return child

    def abort(self) -> None:
        self.barrier.abort()
        for child in self._subgroups:
            child.abort()

    def mailbox(self, src: int, dst: int) -> queue.Queue:
        with self._lock:
            return self._mail.setdefault((src, dst), queue.Queue())

    def run(self, fn: Callable[[int], Any]) -> list[Any]:
        """Run fn(rank) on every virtual rank; re-raise the first real error."""
        results: list[Any] = [None] * self.world_size
        errors: list[tuple[int, BaseException]] = []

        def body(rank: int) -> None:
            try:
                results[rank] = fn(rank)
            except BaseException as exc:  # noqa: BLE001 - forwarded to the caller below
                errors.append((rank, exc))
                self.abort()

        threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(self.world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            primary = [e for e in errors if not isinstance(e[1], ZenCommError)] or errors
            raise min(primary, key=lambda e: e[0])[1]
        return results


class SimComm(Communicator):
    """One virtual rank of a SimGroup."""

    clocked = False

    def __init__(self, group: SimGroup, rank: int, device: torch.device | str = "cpu"):
        super().__init__(rank, group.world_size, torch.device(device), group.seed)
        self.group = group

    def _rendezvous(self, item: Any) -> list[Any]:
        g = self.group
        g.slots[self.rank] = item
        g.barrier.wait()
        items = list(g.slots)
        g.barrier.wait()
        return items

    def _all_reduce(self, tensor: torch.Tensor) -> None:
        items = self._rendezvous(tensor)
        total = None
        if self.rank == 0:
            total = items[0].clone()
            for t in items[1:]:
                total += t
        total = self._rendezvous(total)[0]
        tensor.copy_(total)

    def _all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch.stack(self._rendezvous(tensor.clone()))

    def _all_to_all(self, send: torch.Tensor, send_sizes: list[int], recv_sizes: list[int]) -> torch.Tensor:
        """Point to point through the pairs' mailboxes (first in, first out): no rendezvous, so ranks with
        nothing to say need not wait for the others."""
        offset = 0
        for peer, size in enumerate(send_sizes):
            if size:
                self.group.mailbox(self.rank, peer).put(send[offset : offset + size].clone())
            offset += size
        got = [self._take(peer) for peer, size in enumerate(recv_sizes) if size]
        return torch.cat(got) if got else send.new_empty(0)

    def _all_gather_bytes(self, buf: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
        return self._rendezvous(buf)

    def _take(self, peer: int) -> torch.Tensor:
        box = self.group.mailbox(peer, self.rank)
        waited = 0.0
        while True:
            if self.group.barrier.broken:
                raise ZenCommError(f"rank {self.rank}: group aborted while waiting for rank {peer}")
            try:
                return box.get(timeout=0.5)
            except queue.Empty:
                waited += 0.5
                if waited >= self.group.timeout_s:
                    raise ZenCommError(f"rank {self.rank}: no message from rank {peer} after "
                                       f"{self.group.timeout_s}s") from None
