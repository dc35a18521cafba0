"""One communication thread per hook: runs the buckets' jobs in the order DDP hands them over.

DDP calls the hook from the autograd thread as buckets become ready, in the same order on every rank, and
waits for the futures only at the end of backward. A job per bucket runs here, first in first out, so
the collectives of all buckets are issued in the same order on every rank (a process group matches
collectives by order), while backward goes on computing. The first failure other than bad input
(a timeout, a dead peer) is a `Fault` of the whole hook: a half-finished exchange leaves the groups out of
step, so every later job of every lane fails at once with that first error instead of pairing with stale
messages.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from zen.comm.base import Pending
from zen.device import on
from zen.types import ZenCommError, ZenInputError

Job = Callable[[], None]
T = TypeVar("T", torch.futures.Future, Pending)


class Fault:
    """The first communication failure of a hook, shared by its lanes: after it every lane fails at once.

    It also knows the hook's work in flight (running jobs, issued all-reduces), and a future fails only once
    all of it has ended (each ends by its own timeout): backward then raises with nothing of the hook left
    running. An all-reduce that outlived it would end on gloo's thread while the interpreter exits, and the
    Python callback it then releases aborts the process (std::terminate)."""

    def __init__(self) -> None:
        self.failure: BaseException | None = None
        self._in_flight: list[torch.futures.Future] = []
        self._lock = threading.Lock()

    def record(self, exc: BaseException) -> None:
        if self.failure is None and not isinstance(exc, ZenInputError):
            self.failure = exc

    def track(self, work: T) -> T:
        """Count `work` (a Future, or a Pending) as in flight until it completes; returns it."""
        fut = work.future if isinstance(work, Pending) else work
        with self._lock:
            self._in_flight = [f for f in self._in_flight if not f.done()]
            self._in_flight.append(fut)
        return work

    def fail(self, done: torch.futures.Future, exc: BaseException) -> None:
        """Fail `done` with `exc` once no tracked work is in flight."""
        with self._lock:
            self._in_flight = [f for f in self._in_flight if not f.done()]
            pending = list(self._in_flight)
        if not pending:
            _fail(done, exc)
            return
        all_settled(pending).then(lambda _: _fail(done, exc))


class CommWorker:
    """A daemon thread that runs submitted jobs one at a time, in submission order."""

    def __init__(self, name: str = "zen-comm", device: torch.device | None = None, fault: Fault | None = None):
        self._jobs: queue.SimpleQueue[tuple[Job, torch.futures.Future] | None] = queue.SimpleQueue()
        self._device = device or torch.device("cpu")
        self.fault = fault or Fault()
        self._pending = 0  # submitted jobs not finished yet
        self._lock = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Job, done: torch.futures.Future, inline_if_idle: bool = False,
               inline_after_drain: bool = False) -> None:
        """Run `job` after every job submitted before it; a job that raises fails `done` with its error.
        `inline_if_idle`: when no job is pending, run it right here instead (the same order, without a
        thread hand-off: worth it for a step's last bucket, which has no backward left to overlap).
        `inline_after_drain`: wait here until every earlier job has run, then run it here: everything the
        lane issues for this step is issued before the caller goes on (on NCCL, before DDP's own collectives
        of the step's end, so two communicators see their operations in one order on every rank)."""
        with self._lock:
            if inline_after_drain:
                self._lock.wait_for(lambda: self._pending == 0)
            inline = (inline_if_idle or inline_after_drain) and self._pending == 0
            if not inline:
                self._pending += 1
        if inline:
            self._run(job, done)
        else:
            self._jobs.put((job, done))

    def stop(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=5.0)

    def _loop(self) -> None:
        with on(self._device):  # a new thread's current device is 0
            while (item := self._jobs.get()) is not None:
                self._run(*item)
                with self._lock:
                    self._pending -= 1
                    self._lock.notify_all()

    def _run(self, job: Job, done: torch.futures.Future) -> None:
        if self.fault.failure is not None:
            self.fault.fail(done, ZenCommError(f"zen: an earlier synchronization failed on this rank, so the "
                                               f"process group is out of step; re-create it. First failure: "
                                               f"{self.fault.failure}"))
            return
        running: torch.futures.Future[None] = self.fault.track(torch.futures.Future())
        failure = None
        try:
            job()
        except BaseException as exc:  # noqa: BLE001 - every error must reach DDP through the future
            failure = exc
        running.set_result(None)  # ended: what fails next need not wait for this job
        if failure is not None:
            self.fault.record(failure)
            self.fault.fail(done, failure)


def _fail(done: torch.futures.Future, exc: BaseException) -> None:
    if not done.done():
        done.set_exception(exc)


def settle(done: torch.futures.Future, result: Any, pending: list[Pending], fault: Fault,
           on_done: Callable[[], object] = lambda: None, after: Callable[[], object] = lambda: None) -> None:
    """Complete `done` with `result` once every pending all-reduce has, or fail it (through `fault`, which
    records it) with the first error among them. Nothing blocks here: `done` completes in the callback of the
    last of their futures (gloo's own; on NCCL the completion thread's, zen.comm.completion), so the lane, or
    backward's thread running a bucket inline, goes on meanwhile. `after()` runs there first: on a GPU it makes
    that thread's current stream, which waited only for the all-reduces, wait for the lane's own writes too
    (zen.device.join), since completing `done` hands DDP a dependency on that stream."""
    if not pending:
        on_done()
        done.set_result(result)
        return

    def finish(_: torch.futures.Future) -> None:
        for p in pending:
            try:
                p.wait()
            except BaseException as exc:  # noqa: BLE001 - handed on through the future
                fault.record(exc)
                fault.fail(done, exc)
                return
        after()
        on_done()
        done.set_result(result)

    all_settled([p.future for p in pending]).then(finish)


def all_settled(futures: list[torch.futures.Future]) -> torch.futures.Future:
    """A future that completes once every one of `futures` has, failed or not (`collect_all` fails as soon
    as one fails, while the others may still run)."""
    return torch.futures.collect_all([f.then(lambda _: None) for f in futures])
