"""torch.distributed backend (gloo on CPU, NCCL on GPU): tensors stay on their device and every
collective waits with a timeout, so a dead or missing peer becomes a ZenCommError, not a hang."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from zen.comm.base import Communicator

DEFAULT_TIMEOUT_S = float(os.environ.get("ZEN_TIMEOUT_S", "300"))


class DistComm(Communicator):
    """A Communicator over a torch.distributed process group."""

    def __init__(self, group: dist.ProcessGroup | None = None, timeout_s: float | None = None,
                 seed: int | None = None):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("zen: torch.distributed is not initialized; call init_process_group first")
        backend = dist.get_backend(group)
        device = (
            torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        )
        super().__init__(dist.get_rank(group), dist.get_world_size(group), device, seed)
        self.group = group
        self.timeout = datetime.timedelta(seconds=timeout_s or DEFAULT_TIMEOUT_S)

    def _wait(self, work: dist.Work | None) -> None:
        if work is not None:
            work.wait(timeout=self.timeout)

    def _peer(self, peer: int) -> int:
        return peer if self.group is None else dist.get_global_rank(self.group, peer)

    def _all_reduce(self, tensor: torch.Tensor) -> None:
        self._wait(dist.all_reduce(tensor, group=self.group, async_op=True))

    def _all_reduce_async(self, tensor: torch.Tensor) -> torch.futures.Future:
        # no wait here: the group's own timeout (set when it was created) fails the future
        return dist.all_reduce(tensor, group=self.group, async_op=True).get_future()

    def _all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        outs = [torch.empty_like(tensor) for _ in range(self.world_size)]
        self._wait(dist.all_gather(outs, tensor.contiguous(), group=self.group, async_op=True))
        return torch.stack(outs)

    def _all_to_all(self, bufs: list[torch.Tensor], recv_sizes: list[int]) -> list[torch.Tensor]:
        # on gloo the wire is host memory: CUDA payloads are staged there (and unpacked back, zen.comm.base)
        send = torch.cat(bufs).to(self.device) if bufs else torch.empty(0, dtype=torch.uint8, device=self.device)
        recv = torch.empty(sum(recv_sizes), dtype=torch.uint8, device=self.device)
        work = dist.all_to_all_single(
            recv, send, recv_sizes, [int(b.numel()) for b in bufs], group=self.group, async_op=True
        )
        self._wait(work)
        return list(recv.split(recv_sizes))

    def _all_gather_bytes(self, buf: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
        # all-gather-v as an all-to-all of the same bytes to everyone: exact sizes, no padding
        return self._all_to_all([buf] * self.world_size, sizes)

    def _sendrecv(self, peer: int, send: torch.Tensor | None, recv_size: int | None) -> torch.Tensor | None:
        works = []
        recv = None
        if recv_size is not None:
            recv = torch.empty(recv_size, dtype=torch.uint8, device=self.device)
            if recv_size:
                works.append(dist.irecv(recv, self._peer(peer), group=self.group))
        if send is not None and send.numel():
            works.append(dist.isend(send.contiguous().to(self.device), self._peer(peer), group=self.group))
        for w in works:
            self._wait(w)
        return recv
