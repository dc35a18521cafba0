"""TEST DOUBLE: a torch.distributed backend, "ncclrules", that moves bytes with gloo over real sockets but
enforces NCCL's rules, so code written for NCCL is proven on a machine without GPUs (NCCL cannot run here).

Importing this module registers the backend; `init_process_group("ncclrules")` (harness.launch's `backend=`)
and `new_group` then make `RulesGroup`s. Each group (communicator) has ONE executor thread, the stand-in for
NCCL's stream of that communicator: its operations run there, in issue order, and

(a) point to point: a send or receive runs only when the peer's matching operation (the n-th send from A to
    B matches the n-th receive at B from A; tags are ignored, as NCCL does) runs too. Since each rank's
    operations run in issue order, recv-then-send on both sides never meets: once a peer is late by
    `DEADLOCK_S` while itself waiting for another operation, the rank raises a `RulesViolation` naming both
    ranks' operations and where they were issued. A collective waits in the same way for every rank to run
    the same collective, and refuses one that is another kind or whose sizes do not match the others'. Not
    modelled: communicators of one device starving each other's kernels (Zen issues all of its collectives
    from one lane on one communicator on NCCL, so their order is the same on every rank);
(b) refuses what NCCL lacks: an all-gather of unequal sizes, a receive from any source, sparse tensors;
(c) completes work when it is enqueued (`is_completed()` is True at once, `get_future()` is an already
    completed future) but writes the data into the output only at the consumer's synchronization point,
    `Work.wait()`; until then the output holds poison (NaN, or 0xA5 bytes), so a read before the wait
    shows as wrong results;
(d) counts host reads (`tolist`, `item`, `bool`, `int`, `float`, `numpy`, `cpu`, an index) per thread while
    counting is on (`counting()`), so a test can hold a synchronization's reads against its exchange rounds.

Ranks that use it should set ZEN_EMULATE_ACCELERATOR=1 (zen.device), so zen takes its accelerator code path.
"""

from __future__ import annotations

import datetime
import itertools
import os
import queue
import threading
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo

from zen.comm.dist import NCCL_LIKE, declare_backend

NAME = "ncclrules"
DEADLOCK_S = float(os.environ.get("ZEN_RULES_DEADLOCK_S", "20"))
POISON_BYTE = 0xA5
BROKEN = "[broken]"  # a group's published state after it raised a RulesViolation


class RulesViolation(RuntimeError):
    """Code broke one of NCCL's rules (it would hang or read garbage on a GPU)."""


def _site() -> str:
    """Where an operation was issued: the innermost frame outside torch.distributed and this module."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        name = frame.filename
        if "torch/distributed" not in name and not name.endswith("nccl_rules.py"):
            return f"{os.path.basename(name)}:{frame.lineno} ({frame.name})"
    return "?"


def _poison(t: torch.Tensor) -> None:
    if t.is_floating_point():
        t.fill_(float("nan"))
    elif t.dtype == torch.uint8:
        t.fill_(POISON_BYTE)
    elif t.dtype != torch.bool:
        t.fill_(-0x5A5A5A5A)


class _Executor:
    """A communicator's stream: runs its operations in issue order on a thread of its own."""

    def __init__(self, name: str) -> None:
        self.jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.current = "idle"
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while (job := self.jobs.get()) is not None:
            job()

    def stop(self) -> None:
        """Run what is queued, then end (before the group's gloo is destroyed, on the caller's thread)."""
        self.jobs.put(None)
        self.thread.join(timeout=60)


class RulesWork(dist._Work):
    """Completed at enqueue; `wait()` is the synchronization point that delivers the data."""

    def __init__(self, outputs: list[torch.Tensor]):
        super().__init__()
        self._outputs = outputs
        self._results: list[torch.Tensor] | None = None
        self._error: BaseException | None = None
        self._ran = threading.Event()
        self._delivered = False
        self._future: torch.futures.Future = torch.futures.Future()
        self._future.set_result(outputs)

    def finish(self, results: list[torch.Tensor] | None, error: BaseException | None) -> None:
        self._results, self._error = results, error
        self._ran.set()

    def is_completed(self) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        return self._future

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        limit = timeout.total_seconds() if timeout and timeout.total_seconds() > 0 else None
        if not self._ran.wait(limit):
            raise RuntimeError(f"{NAME}: operation not finished after {limit}s")
        if self._error is not None:
            raise self._error
        if not self._delivered and self._results is not None:
            for out, got in zip(self._outputs, self._results, strict=True):
                out.copy_(got)
            self._delivered = True
        return True


class RulesGroup(dist.ProcessGroup):
    """One group of the double: gloo underneath (`inner`), NCCL's rules on top, the store for handshakes."""

    _ids = itertools.count()

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self.gid = next(RulesGroup._ids)  # groups are made in the same order on every rank
        self.store = PrefixStore(f"{NAME}/{self.gid}", store)
        self.inner = ProcessGroupGloo(PrefixStore(f"{NAME}-gloo/{self.gid}", store), rank, size, timeout)
        self.timeout = timeout
        self.collectives = 0
        self.sent: dict[int, int] = defaultdict(int)
        self.received: dict[int, int] = defaultdict(int)
        self.executor = _Executor(f"{NAME}-stream-{self.gid}")
        self.broken: str | None = None  # the first violation: the group is out of step for good, as NCCL's is

    def getBackendName(self) -> str:
        return NAME

    def shutdown(self) -> None:
        """destroy_process_group: the stream drained and stopped, then gloo torn down here (a gloo group left to
        the interpreter's exit would be destroyed under a thread still using it)."""
        self.executor.stop()
        self.inner = None

    def abort(self) -> None:
        self.shutdown()

    # ---- the stream ------------------------------------------------------------------------------
    def _enqueue(self, what: str, outputs: list[torch.Tensor], run: Callable[[], list[torch.Tensor]]) -> RulesWork:
        work = RulesWork(outputs)
        site = _site()
        for out in outputs:
            _poison(out)

        def job() -> None:
            if self.broken is not None:
                work.finish(None, RulesViolation(f"{NAME}: group {self.gid} broke a rule earlier: {self.broken}"))
                return
            self._publish(f"{what} of group {self.gid}, issued at {site}")
            try:
                results = run()
            except RulesViolation as exc:
                self.broken = str(exc)
                self._publish(f"{BROKEN} {exc}")  # peers waiting on this rank learn it at once
                work.finish(None, exc)
                return
            except BaseException as exc:  # noqa: BLE001 - delivered at the wait
                self._publish("idle")
                work.finish(None, exc)
                return
            self._publish("idle")  # before the wait returns: a process may exit right after it
            work.finish(results, None)

        self.executor.jobs.put(job)
        return work

    def _meet(self, key: str, mine: str, peers: list[int], what: str) -> dict[int, str]:
        """Publish `mine` under `key`, wait until every peer has published theirs (its operation runs), and
        return them. A peer late by DEADLOCK_S that is itself blocked in another operation (and still is a
        moment later) is a deadlock: a RulesViolation naming what each runs. A peer that runs nothing is only
        late: the wait goes on, up to the group's timeout."""
        self.store.set(f"{key}/{self._rank}", mine)
        keys = [f"{key}/{p}" for p in peers]
        self._publish(f"{self.executor.current} [waiting at {key}]")
        deadline = time.monotonic() + self.timeout.total_seconds()
        while True:
            if self._arrived(keys, DEADLOCK_S):
                return {p: self.store.get(k).decode() for p, k in zip(peers, keys, strict=True)}
            late = [p for p, k in zip(peers, keys, strict=True) if not self.store.check([k])]  # is it stuck?
            blocked = {p: self._current(p) for p in late}
            for p, d in blocked.items():
                if d.startswith(BROKEN):
                    raise RulesViolation(f"{NAME}: rank {self._rank} waits in {what} for rank {p}, which found: "
                                         f"{d[len(BROKEN):].strip()}")
            time.sleep(0.5)
            stuck = {p: d for p, d in blocked.items() if "[waiting at " in d and f"[waiting at {key}]" not in d
                     and self._current(p) == d}
            if late and len(stuck) == len(late):
                raise RulesViolation(
                    f"{NAME}: deadlock: rank {self._rank} runs {what} ({self.executor.current}) and waits for "
                    f"{', '.join(f'rank {p}, which runs {d}' for p, d in stuck.items())}. NCCL runs each "
                    f"rank's operations in issue order, so this never completes")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{NAME}: rank {self._rank}: {what} timed out waiting for ranks {late}")

    def _arrived(self, keys: list[str], seconds: float) -> bool:
        """Whether every key is set within `seconds`, polled: a blocking store.wait holds the process's one store
        connection for as long as it waits, so another thread's publish (another group's meet that a peer waits
        on) queued behind it until the wait timed out: DEADLOCK_S of nothing, many times a test."""
        until, pause = time.monotonic() + seconds, 0.001
        while not self.store.check(keys):
            if time.monotonic() >= until:
                return False
            time.sleep(pause)
            pause = min(2 * pause, 0.05)
        return True

    def _current(self, rank: int) -> str:
        key = f"current/{rank}"
        return self.store.get(key).decode() if self.store.check([key]) else "nothing yet"

    def _publish(self, current: str) -> None:
        """What this group's stream runs now, for peers that wait on it."""
        self.executor.current = current
        self.store.set(f"current/{self._rank}", current)

    def _collective(self, kind: str, signature: str, outputs: list[torch.Tensor],
                    run: Callable[[], list[torch.Tensor]], agree: Callable[[dict[int, str]], None] | None = None
                    ) -> RulesWork:
        """A collective: every rank must run the same kind, with `agree` (default: equal signatures)."""
        self.collectives += 1
        n = self.collectives

        def checked() -> list[torch.Tensor]:
            peers = [p for p in range(self._size) if p != self._rank]
            got = self._meet(f"coll/{n}", f"{kind}|{signature}", peers, f"collective #{n} {kind}")
            for p, theirs in got.items():
                if theirs.split("|", 1)[0] != kind:
                    raise RulesViolation(f"{NAME}: rank {self._rank} issued {kind} as collective #{n} of group "
                                         f"{self.gid} where rank {p} issued {theirs.split('|', 1)[0]}")
            if agree is not None:
                agree(got)
            elif any(theirs != f"{kind}|{signature}" for theirs in got.values()):
                raise RulesViolation(f"{NAME}: {kind} #{n} of group {self.gid} with unequal sizes: rank "
                                     f"{self._rank} has {signature}, others {sorted(set(got.values()))}")
            return run()

        return self._enqueue(f"{kind} #{n}", outputs, checked)

    # ---- collectives ---------------------------------------------------------------------------
    @staticmethod
    def _dense(tensors: list[torch.Tensor], what: str) -> None:
        if any(t.layout != torch.strided for t in tensors):
            raise RulesViolation(f"{NAME}: {what} of a sparse tensor: NCCL has no sparse collectives")

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> RulesWork:
        self._dense(tensors, "allreduce")
        snapshot = [t.clone() for t in tensors]  # in place: the input is read before the output is poisoned
        signature = ";".join(f"{t.dtype}{tuple(t.shape)}" for t in tensors)

        def run() -> list[torch.Tensor]:
            self.inner.allreduce(snapshot, opts or dist.AllreduceOptions()).wait()
            return snapshot

        return self._collective("allreduce", signature, tensors, run)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> RulesWork:
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> RulesWork:
        self._dense(tensors, "broadcast")
        snapshot = [t.clone() for t in tensors]
        signature = ";".join(f"{t.dtype}{tuple(t.shape)}" for t in tensors)

        def run() -> list[torch.Tensor]:
            self.inner.broadcast(snapshot, opts or dist.BroadcastOptions()).wait()
            return snapshot

        return self._collective("broadcast", signature, tensors, run)

    def barrier(self, opts: Any = None) -> RulesWork:
        return self._collective("barrier", "", [], lambda: [])

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> RulesWork:
        self._dense([input], "all_gather")
        if output.numel() != input.numel() * self._size:
            raise RulesViolation(f"{NAME}: all_gather_into_tensor of {input.numel()} elements into {output.numel()}")
        snapshot = input.clone()
        staged = torch.empty_like(output)

        def run() -> list[torch.Tensor]:
            self.inner._allgather_base(staged, snapshot).wait()
            return [staged]

        return self._collective("allgather", f"{input.dtype}{input.numel()}", [output], run)

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> RulesWork:
        self._dense(inputs, "all_gather")
        sizes = {t.numel() for lst in outputs for t in lst} | {t.numel() for t in inputs}
        if len(sizes) > 1:
            raise RulesViolation(f"{NAME}: all_gather of unequal sizes {sorted(sizes)}: NCCL's all-gather takes "
                                 f"equal buffers (pad them, and gather into one tensor)")
        snapshot = [t.clone() for t in inputs]
        staged = [[torch.empty_like(t) for t in lst] for lst in outputs]
        flat_out = [t for lst in outputs for t in lst]

        def run() -> list[torch.Tensor]:
            self.inner.allgather(staged, snapshot).wait()
            return [t for lst in staged for t in lst]

        return self._collective("allgather", f"{inputs[0].dtype}{inputs[0].numel()}", flat_out, run)

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                      input_split_sizes: list[int], opts: Any = None) -> RulesWork:
        self._dense([input], "all_to_all")
        P, r = self._size, self._rank
        send = list(input_split_sizes) or [input.shape[0] // P] * P
        recv = list(output_split_sizes) or [output.shape[0] // P] * P
        snapshot = input.clone()
        staged = torch.empty_like(output)

        def agree(got: dict[int, str]) -> None:
            for p, theirs in got.items():
                their_send, their_recv = (list(map(int, x.split(","))) for x in theirs.split("|")[1].split("/"))
                if their_send[r] != recv[p] or their_recv[r] != send[p]:
                    raise RulesViolation(f"{NAME}: all_to_all sizes disagree: rank {p} sends {their_send[r]} and "
                                         f"expects {their_recv[r]}; rank {r} expects {recv[p]} and sends {send[p]}")

        def run() -> list[torch.Tensor]:
            self.inner.alltoall_base(staged, snapshot, recv, send, opts or dist.AllToAllOptions()).wait()
            return [staged]

        signature = f"{','.join(map(str, send))}/{','.join(map(str, recv))}"
        return self._collective("alltoall", signature, [output], run, agree)

    # ---- point to point ------------------------------------------------------------------------
    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> RulesWork:
        self._dense(tensors, "send")
        n = self.sent[dst]
        self.sent[dst] += 1
        snapshot = [t.clone() for t in tensors]

        def run() -> list[torch.Tensor]:
            self._meet(f"p2p/{self._rank}-{dst}/{n}", "send", [dst], f"send #{n} to rank {dst}")
            self.inner.send(snapshot, dst, n).wait()
            return []

        return self._enqueue(f"send #{n} to rank {dst}", [], run)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> RulesWork:
        self._dense(tensors, "recv")
        n = self.received[src]
        self.received[src] += 1
        staged = [torch.empty_like(t) for t in tensors]

        def run() -> list[torch.Tensor]:
            self._meet(f"p2p/{src}-{self._rank}/{n}", "recv", [src], f"recv #{n} from rank {src}")
            self.inner.recv(staged, src, n).wait()
            return staged

        return self._enqueue(f"recv #{n} from rank {src}", tensors, run)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> RulesWork:
        raise RulesViolation(f"{NAME}: receive from any source: NCCL has none")


# ---- (d) host reads --------------------------------------------------------------------------------
_READS = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu")
_counts: dict[int, int] = defaultdict(int)
_on: set[int] = set()
_installed = False


def _counted(name: str) -> Callable[..., Any]:
    original = getattr(torch.Tensor, name)

    def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        me = threading.get_ident()
        if _on and (me in _on or -1 in _on):
            _counts[me] += 1
        return original(self, *args, **kwargs)

    return read


def install_read_counter() -> None:
    """Count host reads of tensors (every thread's, while `counting` is on)."""
    global _installed
    if not _installed:
        for name in _READS:
            setattr(torch.Tensor, name, _counted(name))
        _installed = True


@contextmanager
def counting() -> Iterator[dict[int, int]]:
    """Count host reads in every thread inside the block; yields the counts by thread id."""
    install_read_counter()
    _counts.clear()
    _on.add(-1)
    try:
        yield _counts
    finally:
        _on.discard(-1)


def _create(store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> RulesGroup:
    return RulesGroup(store, rank, size, timeout)


dist.Backend.register_backend(NAME, _create, devices=["cpu"])
declare_backend(NAME, NCCL_LIKE)
