"""One communication thread per hook: runs the buckets' jobs in the order DDP hands them over.

DDP calls the hook from the autograd thread as buckets become ready, in the same order on every rank, and
waits for the futures only at the end of backward. A job per bucket runs here, first in first out, so
the collectives of all buckets are issued in the same order on every rank (a process group matches
collectives by order), while backward goes on computing. The first failure other than bad input
(a timeout, a dead peer) poisons the worker: a half-finished exchange leaves the group out of step, so
every later job fails at once with that first error instead of pairing with stale messages.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import torch

from zen.types import ZenCommError, ZenInputError

Job = Callable[[], None]


class CommWorker:
    """A daemon thread that runs submitted jobs one at a time, in submission order."""

    def __init__(self, name: str = "zen-comm", setup: Callable[[], None] | None = None):
        self._jobs: queue.SimpleQueue[tuple[Job, torch.futures.Future] | None] = queue.SimpleQueue()
        self._setup = setup
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Job, done: torch.futures.Future) -> None:
        """Run `job` after every job submitted before it; a job that raises fails `done` with its error."""
        self._jobs.put((job, done))

    def poison(self, exc: BaseException) -> None:
        """Remember the first communication failure; every later job fails with it."""
        if self.failure is None and not isinstance(exc, ZenInputError):
            self.failure = exc

    def stop(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=5.0)

    def _loop(self) -> None:
        if self._setup is not None:
            self._setup()
        while (item := self._jobs.get()) is not None:
            job, done = item
            if self.failure is not None:
                _fail(done, ZenCommError(f"zen: an earlier synchronization failed on this rank, so the process "
                                         f"group is out of step; re-create it. First failure: {self.failure}"))
                continue
            try:
                job()
            except BaseException as exc:  # noqa: BLE001 - every error must reach DDP through the future
                self.poison(exc)
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
