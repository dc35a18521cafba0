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
    the same collective, and refuses one that is another kind or whose sizes do not match the others';
(b) refuses what NCCL lacks: an all-gather of unequal sizes, a receive from any source, sparse tensors;
(c) completes work only once it has run with its peers (`is_completed()` says so), while `get_future()` is
    complete at enqueue, as NCCL's is; the data reaches the outputs only at the consumer's synchronization
    point, `Work.wait()`; until then outputs hold poison that differs per rank (NaN, or rank-dependent
    integers and bytes), so a read before the wait shows as wrong results and an agreement check that reads
    poison disagrees;
(d) reads an operation's inputs when it runs, not when it is enqueued, and reports (a `RulesViolation` at
    the run or at the wait) an input written after its enqueue, or an output written, before the wait:
    NCCL reads and writes those buffers while the kernel runs;
(e) has NCCL's watchdog: an operation still unfinished a group timeout after its enqueue tears the process
    down (exit status `WATCHDOG_EXIT`, the rule named on stderr), as TORCH_NCCL_ASYNC_ERROR_HANDLING's
    default does, unless the group was aborted first (`abort()` fails its unfinished work at once);
(f) with ZEN_RULES_ONE_STREAM=1, runs every communicator's operations of a rank on one stream in issue
    order: NCCL's worst case for concurrent communicators on one device, where two ranks issuing two
    communicators' operations in different orders deadlock (reported as in (a));
(g) counts host reads per thread and kind while counting is on (`counting()`): values read ("read":
    `tolist`, `item`, `bool`, `int`, `float`, an index, `numpy`, `cpu`, `.to("cpu")`), output sizes that
    depend on data ("shape": `nonzero`, `argwhere`, `unique`, `masked_select`, boolean-mask indexing,
    `repeat_interleave` without `output_size`) and explicit synchronizations ("sync": CUDA event, stream and
    device synchronize). Not modelled: `copy_` between host and device (the emulated device is the host).

ZEN_RULES_DISABLE=rule,... turns rules off (names in `RULES`): how the self-tests show that each rule is what
catches its bug. Ranks that use the double should set ZEN_EMULATE_ACCELERATOR=1 (zen.device), so zen takes its
accelerator code path.
"""

from __future__ import annotations

import atexit
import datetime
import itertools
import os
import queue
import sys
import threading
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo

from zen.comm.dist import NCCL_LIKE, declare_backend

NAME = "ncclrules"
DEADLOCK_S = float(os.environ.get("ZEN_RULES_DEADLOCK_S", "20"))
RULES = ("deadlock", "refuse", "completion", "poison", "rank_poison", "unwritten", "watchdog", "one_stream")
DISABLED = set(os.environ.get("ZEN_RULES_DISABLE", "").split(",")) & set(RULES)  # the self-tests' broken variants
ONE_STREAM = os.environ.get("ZEN_RULES_ONE_STREAM", "0") == "1" and "one_stream" not in DISABLED
POISON_BYTE = 0xA5
WATCHDOG_EXIT = 86
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


def _poison(t: torch.Tensor, rank: int) -> None:
    """Fill `t` with this rank's poison (bools are left as they are)."""
    if "poison" in DISABLED:
        return
    rank = 0 if "rank_poison" in DISABLED else rank
    if t.is_floating_point():
        t.fill_(float("nan"))
    elif t.dtype == torch.uint8:
        t.fill_((POISON_BYTE + 0x1F * rank) & 0xFF)
    elif t.dtype != torch.bool:
        t.fill_(-(0x5A5A5A5A + 7919 * rank))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(-1).view(torch.uint8)


def _poisoned(t: torch.Tensor, rank: int) -> bool:
    want = torch.empty_like(t)
    _poison(want, rank)
    return t.dtype == torch.bool or "poison" in DISABLED or torch.equal(_bits(t), _bits(want))


class _Executor:
    """A stream: runs its operations in issue order on a thread of its own."""

    def __init__(self, name: str) -> None:
        self.jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.current = "idle"
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while (job := self.jobs.get()) is not None:
            job()

    def drain(self) -> None:
        """Return once everything queued so far has run."""
        done = threading.Event()
        self.jobs.put(done.set)
        done.wait(timeout=60)


_SHARED: _Executor | None = None  # ONE_STREAM: every group's stream
_GROUPS: list[RulesGroup] = []
_STREAM_BROKEN: list[str] = []  # ONE_STREAM: a violation on the one stream holds every group's later operations


def _quiesce() -> None:
    """At the interpreter's exit, every group's threads end first: a daemon thread cut off inside gloo's C++ (where
    it releases the GIL) aborts the process ("terminate called without an active exception")."""
    for group in _GROUPS:
        group.aborted = group.aborted or "exiting"
        group.executor.jobs.put(None)
    for group in _GROUPS:
        group.executor.thread.join(timeout=5)
        group.watchdog.join(timeout=5)


atexit.register(_quiesce)
_ROOT: dist.Store | None = None  # the first group's store: where streams publish what they run, across groups


class RulesWork(dist._Work):
    """An operation of the double: complete once it has run with its peers; `wait()` delivers its data, after
    checking that nobody wrote its buffers meanwhile."""

    def __init__(self, group: RulesGroup, what: str, outputs: list[torch.Tensor], inputs: list[torch.Tensor]):
        super().__init__()
        self.what, self.enqueued = what, time.monotonic()
        self._group, self._outputs, self._inputs = group, outputs, inputs
        self._enqueued_inputs = [t.clone() for t in inputs]
        in_place = {t.data_ptr() for t in inputs}
        self._fresh = [t for t in outputs if t.data_ptr() not in in_place]  # outputs that are not inputs
        self._results: list[torch.Tensor] | None = None
        self._error: BaseException | None = None
        self._ran = threading.Event()
        self._delivered = False
        self._future: torch.futures.Future = torch.futures.Future()
        self._future.set_result(outputs)

    def inputs_now(self) -> list[torch.Tensor]:
        """The inputs as the operation reads them when it runs, once they are known unwritten since the enqueue."""
        self._unwritten(self._enqueued_inputs, "after its enqueue, before it ran")
        self._snapshot = [t.clone() for t in self._inputs]
        return self._snapshot

    def _unwritten(self, before: list[torch.Tensor], when: str) -> None:
        if "unwritten" in DISABLED:
            return
        for now, then in zip(self._inputs, before, strict=True):
            if not torch.equal(_bits(now), _bits(then)):
                raise RulesViolation(f"{NAME}: an input buffer of {self.what} was written {when}: NCCL reads it "
                                     f"while the operation runs (keep it untouched until the operation's wait)")

    def finish(self, results: list[torch.Tensor] | None, error: BaseException | None) -> None:
        if not self._ran.is_set():
            self._results, self._error = results, error
            self._ran.set()
            self._group.finished(self)

    def is_completed(self) -> bool:
        return self._ran.is_set() or "completion" in DISABLED

    def get_future(self) -> torch.futures.Future:
        return self._future

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        limit = timeout.total_seconds() if timeout and timeout.total_seconds() > 0 else None
        if not self._ran.wait(limit):
            raise RuntimeError(f"{NAME}: operation not finished after {limit}s")
        if self._error is not None:
            raise self._error
        if not self._delivered and self._results is not None:
            if self._inputs and hasattr(self, "_snapshot"):
                self._unwritten(self._snapshot, "before its wait")
            for out in self._fresh if "unwritten" not in DISABLED else []:
                if not _poisoned(out, self._group.rank()):
                    raise RulesViolation(f"{NAME}: an output buffer of {self.what} was written before its wait: "
                                         f"NCCL writes it while the operation runs")
            for out, got in zip(self._outputs, self._results, strict=True):
                out.copy_(got)
            self._delivered = True
        return True


class RulesGroup(dist.ProcessGroup):
    """One group of the double: gloo underneath (`inner`), NCCL's rules on top, the store for handshakes."""

    _ids = itertools.count()

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta):
        global _ROOT, _SHARED
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self.gid = next(RulesGroup._ids)  # groups are made in the same order on every rank
        self.store = PrefixStore(f"{NAME}/{self.gid}", store)
        _ROOT = _ROOT or PrefixStore(f"{NAME}-streams", store)
        self.inner = ProcessGroupGloo(PrefixStore(f"{NAME}-gloo/{self.gid}", store), rank, size, timeout)
        self.timeout = timeout
        self.options = SimpleNamespace(_timeout=timeout)  # where zen.comm.dist.group_timeout reads it, as on NCCL
        self.collectives = 0
        self.sent: dict[int, int] = defaultdict(int)
        self.received: dict[int, int] = defaultdict(int)
        self.stream = "all" if ONE_STREAM else str(self.gid)
        if ONE_STREAM:
            _SHARED = _SHARED or _Executor(f"{NAME}-stream")
            self.executor = _SHARED
        else:
            self.executor = _Executor(f"{NAME}-stream-{self.gid}")
        self.store.set(f"grank/{rank}", os.environ.get("RANK", str(rank)))
        self.granks = [int(self.store.get(f"grank/{p}")) for p in range(size)]
        self.broken: str | None = None  # the first violation: the group is out of step for good, as NCCL's is
        self.aborted: str | None = None
        self._unfinished: dict[int, RulesWork] = {}
        self._lock = threading.Lock()
        self.watchdog = threading.Thread(target=self._watchdog, name=f"{NAME}-watchdog-{self.gid}", daemon=True)
        self.watchdog.start()
        _GROUPS.append(self)

    def getBackendName(self) -> str:
        return NAME

    def shutdown(self) -> None:
        """destroy_process_group: the stream drained, then gloo torn down here (a gloo group left to the
        interpreter's exit would be destroyed under a thread still using it)."""
        self.executor.drain()
        if not ONE_STREAM:
            self.executor.jobs.put(None)
        self.aborted = self.aborted or "destroyed"
        self.inner = None

    def abort(self) -> None:
        """ncclCommAbort: every unfinished operation fails at once (and the watchdog lets them be)."""
        self.aborted = self.aborted or "aborted"
        with self._lock:
            unfinished = list(self._unfinished.values())
        for work in unfinished:
            work.finish(None, RuntimeError(f"{NAME}: {work.what} of group {self.gid} aborted"))

    def finished(self, work: RulesWork) -> None:
        with self._lock:
            self._unfinished.pop(id(work), None)

    # ---- the watchdog --------------------------------------------------------------------------
    def _watchdog(self) -> None:
        """NCCL's watchdog: an operation unfinished `timeout` after its enqueue tears the process down."""
        limit = self.timeout.total_seconds()
        while self.aborted is None and "watchdog" not in DISABLED:
            time.sleep(min(0.25, limit / 8))
            with self._lock:
                late = [w for w in self._unfinished.values() if time.monotonic() - w.enqueued > limit]
            if late and self.aborted is None:
                sys.stderr.write(f"{NAME}: watchdog: {late[0].what} of group {self.gid} ran past the group's timeout "
                                 f"of {limit:.0f}s counted from its enqueue: NCCL's watchdog tears the process "
                                 f"down here (TORCH_NCCL_ASYNC_ERROR_HANDLING) before any later error\n")
                sys.stderr.flush()
                os._exit(WATCHDOG_EXIT)

    # ---- the stream ------------------------------------------------------------------------------
    def _enqueue(self, what: str, outputs: list[torch.Tensor], run: Callable[[RulesWork], list[torch.Tensor]],
                 inputs: list[torch.Tensor] | None = None) -> RulesWork:
        site = _site()
        label = f"{what} of group {self.gid}, issued at {site}"
        work = RulesWork(self, label, outputs, inputs or [])
        for out in work._fresh:
            _poison(out, self._rank)
        with self._lock:
            self._unfinished[id(work)] = work

        def job() -> None:
            self.broken = self.broken or (_STREAM_BROKEN[0] if _STREAM_BROKEN else None)
            if self.broken is not None or self.aborted is not None:
                why = self.broken or f"the group was {self.aborted}"
                work.finish(None, RulesViolation(f"{NAME}: group {self.gid} broke a rule earlier: {why}")
                            if self.broken else RuntimeError(f"{NAME}: {what}: {why}"))
                return
            self._publish(label)
            try:
                results = run(work)
            except RulesViolation as exc:
                self.broken = str(exc)
                if ONE_STREAM:
                    _STREAM_BROKEN.append(self.broken)
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
        late: the wait goes on, up to the group's timeout; an abort ends it."""
        self.store.set(f"{key}/{self._rank}", mine)
        keys = [f"{key}/{p}" for p in peers]
        here = f"[waiting at {self.gid}:{key}]"
        self._publish(f"{self.executor.current} {here}")
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
            stuck = {p: d for p, d in blocked.items() if "[waiting at " in d and here not in d
                     and self._current(p) == d}
            if late and len(stuck) == len(late) and "deadlock" not in DISABLED:
                raise RulesViolation(
                    f"{NAME}: deadlock: rank {self._rank} runs {what} ({self.executor.current}) and waits for "
                    f"{', '.join(f'rank {p}, which runs {d}' for p, d in stuck.items())}. NCCL runs each "
                    f"rank's operations of a stream in issue order, so this never completes")

    def _arrived(self, keys: list[str], seconds: float) -> bool:
        """Whether every key is set within `seconds`, polled: a blocking store.wait holds the process's one store
        connection for as long as it waits, so another thread's publish (another group's meet that a peer waits
        on) queued behind it until the wait timed out: DEADLOCK_S of nothing, many times a test."""
        until, pause = time.monotonic() + seconds, 0.001
        while not self.store.check(keys):
            if self.aborted is not None:
                raise RuntimeError(f"{NAME}: group {self.gid} {self.aborted} while waiting for its peers")
            if time.monotonic() >= until:
                return False
            time.sleep(pause)
            pause = min(2 * pause, 0.05)
        return True

    def _current(self, rank: int) -> str:
        key = f"current/{self.stream}/{self.granks[rank]}"
        return _ROOT.get(key).decode() if _ROOT.check([key]) else "nothing yet"

    def _publish(self, current: str) -> None:
        """What this group's stream runs now, for peers that wait on it."""
        self.executor.current = current
        _ROOT.set(f"current/{self.stream}/{self.granks[self._rank]}", current)

    def _collective(self, kind: str, signature: str, outputs: list[torch.Tensor],
                    run: Callable[[list[torch.Tensor]], list[torch.Tensor]], inputs: list[torch.Tensor],
                    agree: Callable[[dict[int, str]], None] | None = None) -> RulesWork:
        """A collective: every rank must run the same kind, with `agree` (default: equal signatures); `run`
        gets the inputs as they are when it runs."""
        self.collectives += 1
        n = self.collectives

        def checked(work: RulesWork) -> list[torch.Tensor]:
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
            return run(work.inputs_now())

        return self._enqueue(f"{kind} #{n}", outputs, checked, inputs)

    # ---- collectives ---------------------------------------------------------------------------
    @staticmethod
    def _dense(tensors: list[torch.Tensor], what: str) -> None:
        if any(t.layout != torch.strided for t in tensors):
            raise RulesViolation(f"{NAME}: {what} of a sparse tensor: NCCL has no sparse collectives")

    @staticmethod
    def _signature(tensors: list[torch.Tensor]) -> str:
        return ";".join(f"{t.dtype}{tuple(t.shape)}" for t in tensors)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> RulesWork:
        self._dense(tensors, "allreduce")

        def run(now: list[torch.Tensor]) -> list[torch.Tensor]:
            self.inner.allreduce(now, opts or dist.AllreduceOptions()).wait()
            return now

        return self._in_place("allreduce", tensors, run)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> RulesWork:
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> RulesWork:
        self._dense(tensors, "broadcast")

        def run(now: list[torch.Tensor]) -> list[torch.Tensor]:
            self.inner.broadcast(now, opts or dist.BroadcastOptions()).wait()
            return now

        return self._in_place("broadcast", tensors, run)

    def _in_place(self, kind: str, tensors: list[torch.Tensor],
                  run: Callable[[list[torch.Tensor]], list[torch.Tensor]]) -> RulesWork:
        """An operation whose inputs are its outputs: read at enqueue (the buffer is NCCL's until the wait, so it
        is poisoned then, and must still hold the poison at the wait)."""
        values = [t.clone() for t in tensors]
        work = self._collective(kind, self._signature(tensors), [], lambda _: run(values), [])
        work._outputs, work._fresh = list(tensors), list(tensors)
        for t in tensors:
            _poison(t, self._rank)
        return work

    def barrier(self, opts: Any = None) -> RulesWork:
        return self._collective("barrier", "", [], lambda _: [], [])

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> RulesWork:
        self._dense([input], "all_gather")
        if output.numel() != input.numel() * self._size:
            raise RulesViolation(f"{NAME}: all_gather_into_tensor of {input.numel()} elements into {output.numel()}")
        staged = torch.empty_like(output)

        def run(now: list[torch.Tensor]) -> list[torch.Tensor]:
            self.inner._allgather_base(staged, now[0]).wait()
            return [staged]

        return self._collective("allgather", f"{input.dtype}{input.numel()}", [output], run, [input])

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> RulesWork:
        self._dense(inputs, "all_gather")
        sizes = {t.numel() for lst in outputs for t in lst} | {t.numel() for t in inputs}
        if len(sizes) > 1 and "refuse" not in DISABLED:
            raise RulesViolation(f"{NAME}: all_gather of unequal sizes {sorted(sizes)}: NCCL's all-gather takes "
                                 f"equal buffers (pad them, and gather into one tensor)")
        staged = [[torch.empty_like(t) for t in lst] for lst in outputs]
        flat_out = [t for lst in outputs for t in lst]

        def run(now: list[torch.Tensor]) -> list[torch.Tensor]:
            self.inner.allgather(staged, now).wait()
            return [t for lst in staged for t in lst]

        size = "" if "refuse" in DISABLED else inputs[0].numel()
        return self._collective("allgather", f"{inputs[0].dtype}{size}", flat_out, run, inputs)

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                      input_split_sizes: list[int], opts: Any = None) -> RulesWork:
        self._dense([input], "all_to_all")
        P, r = self._size, self._rank
        send = list(input_split_sizes) or [input.shape[0] // P] * P
        recv = list(output_split_sizes) or [output.shape[0] // P] * P
        staged = torch.empty_like(output)

        def agree(got: dict[int, str]) -> None:
            for p, theirs in got.items():
                their_send, their_recv = (list(map(int, x.split(","))) for x in theirs.split("|")[1].split("/"))
                if their_send[r] != recv[p] or their_recv[r] != send[p]:
                    raise RulesViolation(f"{NAME}: all_to_all sizes disagree: rank {p} sends {their_send[r]} and "
                                         f"expects {their_recv[r]}; rank {r} expects {recv[p]} and sends {send[p]}")

        def run(now: list[torch.Tensor]) -> list[torch.Tensor]:
            self.inner.alltoall_base(staged, now[0], recv, send, opts or dist.AllToAllOptions()).wait()
            return [staged]

        signature = f"{','.join(map(str, send))}/{','.join(map(str, recv))}"
        return self._collective("alltoall", signature, [output], run, [input], agree)

    # ---- point to point ------------------------------------------------------------------------
    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> RulesWork:
        self._dense(tensors, "send")
        n = self.sent[dst]
        self.sent[dst] += 1

        def run(work: RulesWork) -> list[torch.Tensor]:
            self._meet(f"p2p/{self._rank}-{dst}/{n}", "send", [dst], f"send #{n} to rank {dst}")
            self.inner.send(work.inputs_now(), dst, n).wait()
            return []

        return self._enqueue(f"send #{n} to rank {dst}", [], run, tensors)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> RulesWork:
        self._dense(tensors, "recv")
        n = self.received[src]
        self.received[src] += 1
        staged = [torch.empty_like(t) for t in tensors]

        def run(work: RulesWork) -> list[torch.Tensor]:
            self._meet(f"p2p/{src}-{self._rank}/{n}", "recv", [src], f"recv #{n} from rank {src}")
            self.inner.recv(staged, src, n).wait()
            return staged

        return self._enqueue(f"recv #{n} from rank {src}", tensors, run)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> RulesWork:
        raise RulesViolation(f"{NAME}: receive from any source: NCCL has none")


# ---- (g) host reads --------------------------------------------------------------------------------
READ, SHAPE, SYNC = "read", "shape", "sync"
_counts: Counter[tuple[int, str]] = Counter()
_on = threading.Event()
_installed = False


def _note(kind: str) -> None:
    if _on.is_set():
        _counts[(threading.get_ident(), kind)] += 1


def _counted(owner: Any, name: str, kind: str, when: Callable[..., bool] = lambda *a, **k: True) -> None:
    original = getattr(owner, name)

    def read(*args: Any, **kwargs: Any) -> Any:
        if _on.is_set() and when(*args, **kwargs):
            _note(kind)
        return original(*args, **kwargs)

    setattr(owner, name, read)


def _names_host(*args: Any, **kwargs: Any) -> bool:
    """`.to(...)` whose target is the host spelled out as "cpu" (the emulated device is the host object too)."""
    target = kwargs.get("device", args[1] if len(args) > 1 else None)
    return isinstance(target, str) and target.startswith("cpu")


def _bool_index(self: torch.Tensor, index: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


def _sized_by_data(self: torch.Tensor, repeats: Any = None, *args: Any, **kwargs: Any) -> bool:
    return isinstance(repeats, torch.Tensor) and kwargs.get("output_size") is None


def install_read_counter() -> None:
    """Count host reads of tensors (every thread's, while `counting` is on)."""
    global _installed
    if _installed:
        return
    for name in ("tolist", "item", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu"):
        _counted(torch.Tensor, name, READ)
    _counted(torch.Tensor, "to", READ, _names_host)
    for name in ("nonzero", "argwhere", "unique", "unique_consecutive", "masked_select"):
        _counted(torch.Tensor, name, SHAPE)
        if hasattr(torch, name):
            _counted(torch, name, SHAPE)
    _counted(torch.Tensor, "__getitem__", SHAPE, _bool_index)
    _counted(torch.Tensor, "repeat_interleave", SHAPE, _sized_by_data)
    _counted(torch, "repeat_interleave", SHAPE, _sized_by_data)
    for owner in (torch.cuda.Event, torch.cuda.Stream):
        _counted(owner, "synchronize", SYNC)
    _counted(torch.cuda, "synchronize", SYNC)
    _installed = True


class Reads:
    """What `counting()` saw: host reads by thread and kind."""

    def __init__(self, counts: Counter[tuple[int, str]]):
        self._counts = counts

    def of(self, kind: str | None = None, thread: int | None = None) -> int:
        return sum(n for (t, k), n in self._counts.items() if (kind is None or k == kind)
                   and (thread is None or t == thread))


@contextmanager
def counting() -> Iterator[Reads]:
    """Count host reads in every thread inside the block."""
    install_read_counter()
    _counts.clear()
    _on.set()
    try:
        yield Reads(_counts)
    finally:
        _on.clear()


def _create(store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> RulesGroup:
    return RulesGroup(store, rank, size, timeout)


dist.Backend.register_backend(NAME, _create, devices=["cpu"])
declare_backend(NAME, NCCL_LIKE)
