"""torch.distributed backend (gloo on CPU, NCCL on GPU): tensors stay on their device and every
collective carries a timeout, so a dead, missing or late peer becomes a ZenCommError, not a hang.

The timeout goes into the collective itself (its options), not only into the wait: gloo then fails the
operation and closes its connections, so a late peer never meets a stale half-finished operation (that
paired it with the wrong call: wrong sums, or gloo aborting the process on a size mismatch), and the
survivors' `destroy_process_group` returns at once instead of waiting for the group's own timeout.
"""

from __future__ import annotations

import datetime
import os
import weakref

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from zen.comm.base import Communicator
from zen.types import ZenCommError, ZenInputError

FALLBACK_TIMEOUT_S = 300.0
BRUCK_TAG = 1  # point-to-point tags of the all-gather's rounds (1, 2, ...); messages of varying size use 0
GRACE_S = 30.0  # a collective's own timeout fires first; the wait only backs it up (NCCL, a stuck backend)


def timeout_seconds(timeout_s: float | None = None) -> float:
    """`timeout_s`, else $ZEN_TIMEOUT_S read now (not at import), else 300 s; must be positive."""
    if timeout_s is None:
        raw = os.environ.get("ZEN_TIMEOUT_S", "")
        try:
            timeout_s = float(raw) if raw else FALLBACK_TIMEOUT_S
        except ValueError:
            raise ZenInputError(f"zen: ZEN_TIMEOUT_S must be a number of seconds, got {raw!r}") from None
    if not timeout_s > 0:
        raise ZenInputError(f"zen: timeout_s must be > 0 seconds, got {timeout_s}")
    return float(timeout_s)


def live_group(group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    """The process group object `group` names now (None: the current default group)."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("zen: torch.distributed is not initialized; call init_process_group first")
    return group if group is not None else c10d._get_default_group()


def is_live(group: dist.ProcessGroup | None) -> bool:
    """Whether `group` is still registered (not destroyed)."""
    return group is not None and dist.is_initialized() and group in c10d._world.pg_map


class DistComm(Communicator):
    """A Communicator over a torch.distributed process group. `timeout_s=None` reads $ZEN_TIMEOUT_S once
    per call."""

    def __init__(self, group: dist.ProcessGroup | None = None, timeout_s: float | None = None,
                 seed: int | None = None):
        pg = live_group(group)
        # a weak reference: a destroyed group must really go when the user drops it (a process group that
        # outlives destroy_process_group is torn down at interpreter exit, where gloo aborts the process)
        self._pg = weakref.ref(pg)
        if timeout_s is not None:
            timeout_seconds(timeout_s)
        self.timeout_s = timeout_s
        self._call_timeout = (-1, 0.0)  # (call, its timeout in seconds): $ZEN_TIMEOUT_S read once per call
        backend = self.backend = dist.get_backend(pg)
        device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        super().__init__(dist.get_rank(pg), dist.get_world_size(pg), device, seed)
        self.group = group

    @property
    def pg(self) -> dist.ProcessGroup:
        pg = self._pg()
        if pg is None:
            raise ZenCommError(f"rank {self.rank}/{self.world_size}: the process group of this communicator was "
                               f"destroyed")
        return pg

    def alive(self) -> bool:
        return is_live(self._pg())

    @property
    def seconds(self) -> float:
        """This call's timeout: `timeout_s`, else $ZEN_TIMEOUT_S as it was at the call's first operation (an
        environment lookup per operation costs more CPU than a small exchange's own Python)."""
        call, seconds = self._call_timeout
        if call != self.call:
            seconds = timeout_seconds(self.timeout_s)
            self._call_timeout = (self.call, seconds)
        return seconds

    @property
    def timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.seconds)

    def _opts(self, kind: type) -> object:
        opts = kind()
        opts.timeout = self.timeout
        return opts

    def _wait(self, work: dist.Work | None, own_timeout: bool = True) -> None:
        """Wait for `work`. A collective carries the timeout itself (`own_timeout`): gloo then ends it, and a
        wait that gave up first would leave it running (a process that exits meanwhile aborts), so the
        wait allows GRACE_S more. A point-to-point wait is the timeout: gloo closes the pair when it fires."""
        if work is not None:
            extra = GRACE_S if own_timeout else 0.0
            work.wait(timeout=datetime.timedelta(seconds=self.seconds + extra))

    def _issue_all_reduce(self, tensor: torch.Tensor) -> dist.Work:
        opts = self._opts(c10d.AllreduceOptions)
        opts.reduceOp = dist.ReduceOp.SUM
        return self.pg.allreduce([tensor], opts)

    def _all_reduce(self, tensor: torch.Tensor) -> None:
        self._wait(self._issue_all_reduce(tensor))

    def _all_reduce_async(self, tensor: torch.Tensor) -> torch.futures.Future:
        return self._issue_all_reduce(tensor).get_future()  # the operation's own timeout fails the future

    def _all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.backend != "gloo":
            outs = [torch.empty_like(tensor) for _ in range(self.world_size)]
            self._wait(self.pg.allgather([outs], [tensor.contiguous()], self._opts(c10d.AllgatherOptions)))
            return torch.stack(outs)
        return self._bruck_all_gather(tensor)

    def _bruck_all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Bruck's all-gather, point to point: ceil(log2 P) rounds where gloo's ring takes P - 1, and every round
        a wake-up of each rank (8 ranks on 2 cores: half the latency of an input check). Round i sends the
        rows gathered so far to rank r - 2^i and gets as many from rank r + 2^i; its own tag and fixed size
        (the same on every rank) keep the rounds of calls that are out of step from pairing up."""
        P, r = self.world_size, self.rank
        table = torch.empty((P, *tensor.shape), dtype=tensor.dtype, device=self.device)
        table[0] = tensor  # row i: rank (r + i) % P's
        have, round_ = 1, 0
        while have < P:
            n = min(have, P - have)
            works = [self.pg.recv([table[have : have + n]], (r + have) % P, BRUCK_TAG + round_),
                     self.pg.send([table[:n]], (r - have) % P, BRUCK_TAG + round_)]
            self._wait_all(works)
            have, round_ = have + n, round_ + 1
        return torch.roll(table, shifts=r, dims=0)

    def _all_to_all(self, bufs: list[torch.Tensor], recv_sizes: list[int]) -> list[torch.Tensor]:
        # on gloo the wire is host memory: CUDA payloads are staged there (and unpacked back, zen.comm.base)
        if self.backend != "gloo":  # NCCL runs separately posted sends and receives in order: one collective
            return self._all_to_all_base(bufs, recv_sizes)
        # gloo posts them at once: point to point, each buffer goes out as it is, where alltoall_base wants
        # them concatenated and copies this rank's own part (a fifth of a two-level step's CPU, 2 ranks per node)
        r = self.rank
        sends = [b.contiguous().to(self.device) for b in bufs]
        got = [sends[j] if j == r else torch.empty(size, dtype=torch.uint8, device=self.device)
               for j, size in enumerate(recv_sizes)]
        works = [self.pg.recv([got[j]], j, 0) for j in range(self.world_size) if j != r and recv_sizes[j]]
        works += [self.pg.send([sends[j]], j, 0) for j in range(self.world_size) if j != r and sends[j].numel()]
        self._wait_all(works)
        return got

    def _all_to_all_base(self, bufs: list[torch.Tensor], recv_sizes: list[int]) -> list[torch.Tensor]:
        send = torch.cat(bufs).to(self.device) if bufs else torch.empty(0, dtype=torch.uint8, device=self.device)
        recv = torch.empty(sum(recv_sizes), dtype=torch.uint8, device=self.device)
        work = self.pg.alltoall_base(recv, send, recv_sizes, [int(b.numel()) for b in bufs],
                                     self._opts(c10d.AllToAllOptions))
        self._wait(work)
        return list(recv.split(recv_sizes))

    def _all_gather_bytes(self, buf: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
        # the same buffer to every peer (staged once): exact sizes, no padding
        send = buf.contiguous().to(self.device)
        return self._all_to_all([send] * self.world_size, sizes)

    def _sendrecv(self, peer: int, send: torch.Tensor | None, recv_size: int | None) -> torch.Tensor | None:
        works = []
        recv = None
        if recv_size is not None:
            recv = torch.empty(recv_size, dtype=torch.uint8, device=self.device)
            if recv_size:
                works.append(self.pg.recv([recv], peer, 0))  # group ranks, as the schemes use them
        if send is not None and send.numel():
            works.append(self.pg.send([send.contiguous().to(self.device)], peer, 0))
        self._wait_all(works)
        return recv

    def _wait_all(self, works: list[dist.Work]) -> None:
        """Every point-to-point operation waited for, even after one failed: nothing of an exchange may
        outlive it (a wait that times out makes gloo close the pair, so nothing stale is left behind)."""
        failure = None
        for w in works:
            try:
                self._wait(w, own_timeout=False)
            except Exception as exc:  # noqa: BLE001 - the first is raised below
                failure = failure or exc
        if failure is not None:
            raise failure
