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
from typing import Any

import torch

from zen.types import ZenCommError, ZenInputError

Job = Callable[[], None]


class Fault:
    """The first communication failure of a hook, shared by its lanes: after it every lane fails at once."""

    def __init__(self) -> None:
        self.failure: BaseException | None = None

    def record(self, exc: BaseException) -> None:
        if self.failure is None and not isinstance(exc, ZenInputError):
            self.failure = exc


class CommWorker:
    """A daemon thread that runs submitted jobs one at a time, in submission order."""

    def __init__(self, name: str = "zen-comm", setup: Callable[[], None] | None = None, fault: Fault | None = None):
        self._jobs: queue.SimpleQueue[tuple[Job, torch.futures.Future] | None] = queue.SimpleQueue()
        self._setup = setup
        self.fault = fault or Fault()
        self._pending = 0  # submitted jobs not finished yet
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Job, done: torch.futures.Future, inline_if_idle: bool = False) -> None:
        """Run `job` after every job submitted before it; a job that raises fails `done` with its error.
        `inline_if_idle`: when no job is pending, run it right here instead (the same order, without a
        thread hand-off: worth it for a step's last bucket, which has no backward left to overlap)."""
        with self._lock:
            inline = inline_if_idle and self._pending == 0
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
        if self._setup is not None:
            self._setup()
        while (item := self._jobs.get()) is not None:
            self._run(*item)
            with self._lock:
                self._pending -= 1

    def _run(self, job: Job, done: torch.futures.Future) -> None:
        if self.fault.failure is not None:
            _fail(done, ZenCommError(f"zen: an earlier synchronization failed on this rank, so the process "
                                     f"group is out of step; re-create it. First failure: {self.fault.failure}"))
            return
        try:
            job()
        except BaseException as exc:  # noqa: BLE001 - every error must reach DDP through the future
            self.fault.record(exc)
            _fail(done, exc)


def _fail(done: torch.futures.Future, exc: BaseException) -> None:
    if not done.done():
        done.set_exception(exc)


def settle(done: torch.futures.Future, result: Any, pending: list[torch.futures.Future],
           on_error: Callable[[BaseException], None]) -> None:
    """Complete `done` with `result` once every future in `pending` has, or with the first error among them."""
    if not pending:
        done.set_result(result)
        return

    def finish(futures: torch.futures.Future) -> None:
        for fut in futures.value():
            try:
                fut.value()
            except BaseException as exc:  # noqa: BLE001 - handed on through the future
                on_error(exc)
                _fail(done, exc)
                return
        done.set_result(result)

    torch.futures.collect_all(pending).then(finish)
