"""torch.distributed backend: gloo on the host, NCCL (or any backend with its rules) on the device.

The backend is chosen per device type from the group's configuration ("cpu:gloo,cuda:nccl" puts a CUDA
payload on NCCL and a CPU one on gloo), and its rules (`BackendRules`) decide how bytes move:
- gloo runs point-to-point operations as they arrive, so exchanges are posted as separate sends and
  receives to the peers that have something, and its futures complete when the data is there. CUDA payloads
  are staged on the host.
- NCCL runs a pair's operations in issue order on one stream, has no unequal all-gather, and completes a
  future when the work is enqueued (the data is there only for streams that wait on it). So an exchange is
  one `alltoall_base` every rank joins (an NCCL group of the non-empty sends and receives: no recv-then-send
  deadlock, no pair communicator per peer), an uneven all-gather is padded, and completion is learned from
  a thread that waits for the work (zen.comm.completion), never from NCCL's future.

Every collective carries a timeout, so a dead, missing or late peer becomes a ZenCommError, not a hang. On
gloo the timeout goes into the collective itself (its options): gloo then fails the operation and closes its
connections, so a late peer never meets a stale half-finished operation, and the survivors'
`destroy_process_group` returns at once. On NCCL the deadline is counted from each operation's issue, as
NCCL's watchdog counts, and shorter than the group's timeout (the watchdog's): when it passes, the group is
aborted (`_on_failure`), so the kernels stuck on a dead peer end and every rank raises ZenCommError before
the watchdog would tear the process down (docs/gpu.md).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time
import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from zen.comm.base import Communicator, Pending
from zen.comm.completion import Completions
from zen.types import ZenCommError, ZenInputError

FALLBACK_TIMEOUT_S = 300.0
BRUCK_TAG = 1  # point-to-point tags of the all-gather's rounds (1, 2, ...); messages of varying size use 0
GRACE_S = 30.0  # a collective's own timeout fires first; the wait only backs it up (NCCL, a stuck backend)
WATCHDOG_MARGIN_S = 10.0  # Zen's deadline ends at least this long (or a quarter of it) before a group's watchdog


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


@dataclass(frozen=True)
class BackendRules:
    """What a torch.distributed backend guarantees, as far as this layer cares. `ordered`: NCCL's rules
    (point-to-point in issue order per pair, equal-size all-gathers only, futures complete at enqueue);
    `host_wire`: payloads travel through host memory (gloo); `short_receives`: a receive takes a message shorter
    than its buffer (gloo; NCCL needs the sizes to match), so a bounded exchange is one round; `watchdog`: the
    backend acts on its own when an operation outlives the group's timeout counted from enqueue (NCCL)."""

    ordered: bool
    host_wire: bool = False
    short_receives: bool = False
    watchdog: bool = False


GLOO = BackendRules(ordered=False, host_wire=True, short_receives=True)
NCCL_LIKE = BackendRules(ordered=True, watchdog=True)
_RULES: dict[str, BackendRules] = {"gloo": GLOO, "nccl": NCCL_LIKE}


def declare_backend(name: str, rules: BackendRules) -> None:
    """Tell this layer the rules of a backend registered with torch.distributed (an unknown backend is
    treated as NCCL-like: its strictest reading)."""
    _RULES[name.lower()] = rules


def rules_of(backend: str) -> BackendRules:
    return _RULES.get(backend.lower(), NCCL_LIKE)


def backend_for(pg: dist.ProcessGroup, device: torch.device) -> str:
    """The backend of `pg` that serves tensors on `device` ("cpu:gloo,cuda:nccl" -> gloo for the host, nccl
    for CUDA); a group configured with one backend for every device gives that one."""
    config = str(dist.get_backend_config(pg))
    entries = dict(e.split(":", 1) for e in config.split(",") if ":" in e)
    if not entries:
        return config
    if device.type in entries:
        return entries[device.type]
    raise ZenInputError(f"zen: the process group has no backend for {device.type} tensors ({config}); "
                        f"initialise it with one (e.g. backend='cpu:gloo,cuda:nccl')")


def default_device(pg: dist.ProcessGroup) -> torch.device:
    """The device a group's payloads live on when the caller names none: this process's current CUDA device
    when the group has a CUDA backend, else the host."""
    config = str(dist.get_backend_config(pg))
    if torch.cuda.is_available() and ("cuda" in config or config == "nccl"):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def group_timeout(pg: dist.ProcessGroup, device: torch.device) -> float | None:
    """The timeout `pg` was made with for `device`'s backend (NCCL's watchdog acts after it), in seconds; None
    where the group does not say."""
    for owner in (lambda: pg._get_backend(device), lambda: pg):
        with contextlib.suppress(AttributeError, RuntimeError):
            return float(owner().options._timeout.total_seconds())
    return None


def watchdog_room(group_s: float) -> float:
    """The longest deadline Zen may count from an operation's issue on a group whose watchdog acts after
    `group_s` seconds from its enqueue: its error must come first."""
    return group_s - min(WATCHDOG_MARGIN_S, group_s / 4)


def group_timeout_for(seconds: float) -> datetime.timedelta:
    """The timeout of a group Zen makes for itself: Zen's deadline of `seconds` ends well before its watchdog."""
    return datetime.timedelta(seconds=seconds + GRACE_S)


def live_group(group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    """The process group object `group` names now (None: the current default group)."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("zen: torch.distributed is not initialized; call init_process_group first")
    return group if group is not None else c10d._get_default_group()


def is_live(group: dist.ProcessGroup | None) -> bool:
    """Whether `group` is still registered (not destroyed)."""
    return group is not None and dist.is_initialized() and group in c10d._world.pg_map


class DistComm(Communicator):
    """A Communicator over a torch.distributed process group, for payloads on `device` (None: see
    `default_device`). `timeout_s=None` reads $ZEN_TIMEOUT_S once per call."""

    def __init__(self, group: dist.ProcessGroup | None = None, timeout_s: float | None = None,
                 seed: int | None = None, device: torch.device | str | None = None):
        pg = live_group(group)
        # a weak reference: a destroyed group must really go when the user drops it (a process group that
        # outlives destroy_process_group is torn down at interpreter exit, where gloo aborts the process)
        self._pg = weakref.ref(pg)
        if timeout_s is not None:
            timeout_seconds(timeout_s)
        self.timeout_s = timeout_s
        self._call_timeout = (-1, 0.0)  # (call, its timeout in seconds): $ZEN_TIMEOUT_S read once per call
        device = torch.device(device) if device is not None else default_device(pg)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.backend = backend_for(pg, device)
        self.rules = rules_of(self.backend)
        self.pads_all_gather = self.rules.ordered
        self.short_receives = self.rules.short_receives
        self.watchdog_s = group_timeout(pg, device) if self.rules.watchdog else None
        self._completions: Completions | None = None
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
        environment lookup per operation costs more CPU than a small exchange's own Python), else the default,
        shortened to end before the group's watchdog (`watchdog_room`)."""
        call, seconds = self._call_timeout
        if call != self.call:
            seconds = self._before_watchdog(timeout_seconds(self.timeout_s))
            self._call_timeout = (self.call, seconds)
        return seconds

    def _before_watchdog(self, seconds: float) -> float:
        """`seconds`, or where a watchdog would act first: the room left before it if Zen's timeout is its
        default, else a ZenInputError (a timeout the user chose is not silently shortened)."""
        if self.watchdog_s is None or seconds <= (room := watchdog_room(self.watchdog_s)):
            return seconds
        if self.timeout_s is None and not os.environ.get("ZEN_TIMEOUT_S"):
            return room
        raise ZenInputError(
            f"zen: rank {self.rank}/{self.world_size}: Zen's timeout of {seconds:.0f}s does not end before the "
            f"process group's own timeout of {self.watchdog_s:.0f}s, after which {self.backend}'s watchdog tears "
            f"the process down: give the group a longer one (init_process_group(timeout=...) or new_group(timeout="
            f"...) of at least {group_timeout_for(seconds).total_seconds():.0f}s) or Zen a shorter one (timeout_s / "
            f"ZEN_TIMEOUT_S <= {room:.0f}s)")

    def begin_call(self, code: int, sizes_agreed: bool = False) -> None:
        super().begin_call(code, sizes_agreed)
        _ = self.seconds  # a timeout the group's watchdog would beat is refused here, before any operation

    @property
    def timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.seconds)

    def _opts(self, kind: type) -> object:
        opts = kind()
        opts.timeout = self.timeout
        return opts

    def _wire_device(self) -> torch.device:
        return torch.device("cpu") if self.rules.host_wire else self.device

    def _on_failure(self) -> None:
        if self.rules.ordered:  # a kernel waiting for a dead peer would hold the device forever
            abort = getattr(self._pg(), "abort", None)
            if abort is not None:
                with contextlib.suppress(Exception):  # best effort: the communicator is poisoned anyway
                    abort()

    def _wait(self, work: dist.Work | None, own_timeout: bool = True, what: str = "operation") -> None:
        """Wait for `work` on the host. gloo: a collective carries the timeout itself (`own_timeout`): gloo
        then ends it, and a wait that gave up first would leave it running (a process that exits meanwhile
        aborts), so the wait allows GRACE_S more; a point-to-point wait is the timeout (gloo closes the pair
        when it fires). NCCL-like: block on the Future the completion thread completes once the work has run
        (its deadline counted from now, the work's issue); the caller's stream then waits for it too."""
        if work is None:
            return
        if not self.rules.ordered:
            extra = GRACE_S if own_timeout else 0.0
            work.wait(timeout=datetime.timedelta(seconds=self.seconds + extra))
            return
        self._completed(work, time.monotonic(), what).wait()

    def _completed(self, work: dist.Work, issued: float, what: str,
                   result: torch.Tensor | None = None) -> torch.futures.Future:
        """A Future that completes once `work` (issued at `issued`) has run: zen.comm.completion's, made at the
        first operation; it holds this communicator weakly."""
        if self._completions is None:
            me = weakref.ref(self)

            def expire(what: str) -> None:
                if (comm := me()) is not None:
                    comm._expire(what)

            def failure() -> str | None:
                comm = me()
                return comm.failure if comm is not None else "the communicator was collected"

            self._completions = Completions(self.device, expire, failure)
        return self._completions.track(work, issued, self.seconds, f"{self.backend} {what} of call {self.call}",
                                       result)

    def _expire(self, what: str) -> None:
        """An operation outlived Zen's deadline: poison the communicator and abort the group (`_on_failure`)."""
        self._poison(f"rank {self.rank}/{self.world_size}: a {what} did not complete within {self.seconds:.0f}s of "
                     f"its issue (a peer dead, missing or late); the group was aborted before its own timeout "
                     f"({self.watchdog_s or 0:.0f}s) ran out")

    def _issue_all_reduce(self, tensor: torch.Tensor) -> dist.Work:
        opts = self._opts(c10d.AllreduceOptions)
        opts.reduceOp = dist.ReduceOp.SUM
        return self.pg.allreduce([tensor], opts)

    def _all_reduce(self, tensor: torch.Tensor) -> None:
        self._wait(self._issue_all_reduce(tensor), what="all-reduce")

    def _all_reduce_async(self, tensor: torch.Tensor) -> Pending:
        issued = time.monotonic()
        work = self._issue_all_reduce(tensor)
        if self.rules.ordered:  # its own future completes at enqueue: completion comes from the completion thread
            return Pending(tensor, future=self._completed(work, issued, "all-reduce", result=tensor))
        return Pending(tensor, future=work.get_future())  # the operation's own timeout fails the future

    def _all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.rules.ordered:
            out = torch.empty((self.world_size, *tensor.shape), dtype=tensor.dtype, device=tensor.device)
            self._wait(self.pg._allgather_base(out.view(-1), tensor.contiguous().view(-1),
                                               self._opts(c10d.AllgatherOptions)), what="all-gather")
            return out
        return self._bruck_all_gather(tensor.to(self._wire_device())).to(tensor.device)

    def _bruck_all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Bruck's all-gather, point to point: ceil(log2 P) rounds where gloo's ring takes P - 1, and every round
        a wake-up of each rank (what an input check waits for where ranks share cores). Round i sends the
        rows gathered so far to rank r - 2^i and gets as many from rank r + 2^i; its own tag and fixed size
        (the same on every rank) keep the rounds of calls that are out of step from pairing up. gloo only:
        NCCL ignores tags and runs a pair's operations in order."""
        P, r = self.world_size, self.rank
        table = torch.empty((P, *tensor.shape), dtype=tensor.dtype, device=tensor.device)
        table[0] = tensor  # row i: rank (r + i) % P's
        have, round_ = 1, 0
        while have < P:
            n = min(have, P - have)
            works = [self.pg.recv([table[have : have + n]], (r + have) % P, BRUCK_TAG + round_),
                     self.pg.send([table[:n]], (r - have) % P, BRUCK_TAG + round_)]
            self._wait_all(works)
            have, round_ = have + n, round_ + 1
        return torch.roll(table, shifts=r, dims=0)

    def _all_to_all(self, send: torch.Tensor, send_sizes: list[int], recv_sizes: list[int]) -> torch.Tensor:
        recv = self.pool.take(sum(recv_sizes), send.device)
        if self.rules.ordered:  # one collective: NCCL groups its sends and receives, none blocks another
            self._wait(self.pg.alltoall_base(recv, send, recv_sizes, send_sizes, self._opts(c10d.AllToAllOptions)),
                       what="all-to-all")
            return recv
        # gloo: point to point, only to and from the peers that have something, each buffer as it is
        works = []
        offset = 0
        for j, size in enumerate(recv_sizes):
            if size:
                works.append(self.pg.recv([recv[offset : offset + size]], j, 0))
            offset += size
        offset = 0
        for j, size in enumerate(send_sizes):
            if size:
                works.append(self.pg.send([send[offset : offset + size]], j, 0))
            offset += size
        self._wait_all(works)
        return recv

    def _all_gather_bytes(self, buf: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
        P, r = self.world_size, self.rank
        if self.rules.ordered:  # equal sizes only: every message padded to the largest
            top = max(sizes)
            padded = buf if buf.numel() == top else torch.cat([buf, buf.new_zeros(top - buf.numel())])
            out = self.pool.take(P * top, buf.device)
            self._wait(self.pg._allgather_base(out, padded, self._opts(c10d.AllgatherOptions)), what="all-gather")
            return [out[j * top : j * top + sizes[j]] for j in range(P)]
        # gloo: the same buffer to every peer (no copies), exact sizes, no padding on the wire; each peer's message
        # lands on a 64-byte line of the receive buffer, so its first tensor is a view there whatever the sizes
        starts, end = [], 0
        for j in range(P):
            starts.append(end)
            end += -(-sizes[j] // 64) * 64 if j != r else 0
        recv = self.pool.take(end, buf.device)
        out = [buf if j == r else recv[starts[j] : starts[j] + sizes[j]] for j in range(P)]
        works = [self.pg.recv([out[j]], j, 0) for j in range(P) if j != r and sizes[j]]
        works += [self.pg.send([buf], j, 0) for j in range(P) if j != r and sizes[r]]
        self._wait_all(works)
        return out

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
