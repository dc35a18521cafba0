"""Host-side completion of a watchdog backend's work (NCCL), with Zen's deadline counted from issue.

Why a thread of its own: NCCL completes a work's future when the work is enqueued, so the host learns that
data arrived only by synchronizing with the device, and NCCL's watchdog counts the group's timeout from
enqueue. Sleep-polling `is_completed()` in the caller's thread (what this replaced) added up to a
millisecond to every operation and held the caller (a hook's lane, or backward's thread) for every dense
all-reduce. Here one thread per communicator waits for its operations in issue order (the order NCCL runs
them) on a stream of its own, and completes a device-aware Future for each: consumers chain on it, or
block on it without polling.

A second thread holds Zen's deadline for the operation being waited for, counted from when that operation
was issued, as the watchdog counts: if it passes first, `expire` runs (the communicator poisons itself and
aborts its group, which ends the stuck kernels and with them every wait on them). A group's own timeout is
longer than Zen's (zen.comm.dist), so Zen's ZenCommError always comes before the watchdog acts.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch

from zen.device import Stream, on, result_future
from zen.types import ZenCommError

Expire = Callable[[str], None]


class _Watch:
    """The deadline of the operation being waited for now; `expire` runs once if it passes first."""

    def __init__(self, expire: Expire):
        self._expire = expire
        self._cond = threading.Condition()
        self._current: tuple[float, str] | None = None
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="zen-deadline", daemon=True)
        self._thread.start()

    def arm(self, deadline: float, what: str) -> None:
        with self._cond:
            self._current = (deadline, what)
            self._cond.notify()

    def disarm(self) -> None:
        with self._cond:
            self._current = None

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        with self._cond:
            while not self._stopped:
                current = self._current
                left = current[0] - time.monotonic() if current is not None else None
                if left is None or left > 0:
                    self._cond.wait(left)
                    continue
                self._current = None
                self._cond.release()
                try:
                    self._expire(current[1])
                finally:
                    self._cond.acquire()


class Completions:
    """Completes a Future per tracked operation once it has run, in issue order, on `device`'s stream of its
    own. `expire(what)` is called when an operation outlives its deadline; `failure()` names a failure that
    fails every later operation at once. Neither may hold the communicator strongly (its threads end when
    this object is collected)."""

    def __init__(self, device: torch.device, expire: Expire, failure: Callable[[], str | None]):
        self._device = device
        self._queue: queue.SimpleQueue[tuple[Any, float, str, torch.futures.Future] | None] = queue.SimpleQueue()
        watch = _Watch(expire)
        thread = threading.Thread(target=_complete, args=(self._queue, device, watch, failure),
                                  name="zen-completion", daemon=True)
        thread.start()
        weakref.finalize(self, _stop, self._queue, thread)  # also at exit: no thread of ours runs past it

    def track(self, work: Any, issued: float, seconds: float, what: str,
              result: torch.Tensor | None = None) -> torch.futures.Future:
        """A Future (of `result`) that completes once `work` has run, its data then visible on any stream that
        waits on the Future, or fails with the communicator's failure; `issued + seconds` is its deadline."""
        done = result_future(self._device)
        self._queue.put((work, issued + seconds, what, done))
        return done if result is None else done.then(lambda _: result)


def _stop(jobs: queue.SimpleQueue, thread: threading.Thread) -> None:
    """End the completion thread (and its deadline's) once what it was given is done: when the communicator is
    collected, and at the interpreter's exit, before daemon threads are cut off wherever they are."""
    jobs.put(None)
    if thread is not threading.current_thread():
        thread.join(timeout=5)


def _complete(jobs: queue.SimpleQueue, device: torch.device, watch: _Watch, failure: Callable[[], str | None]) -> None:
    """The completion thread: each operation waited for in issue order under its deadline."""
    stream = Stream(device)
    with on(device), stream.use():
        while (item := jobs.get()) is not None:
            work, deadline, what, done = item
            del item
            error: BaseException | None = None
            if failure() is None:
                watch.arm(deadline, what)
                try:
                    work.wait()  # NCCL: this thread's stream waits for the work; a test double: until it ran
                    stream.synchronize()  # the host waits for that stream (aborting the group ends it)
                except BaseException as exc:  # noqa: BLE001 - handed on through the Future
                    error = exc
                finally:
                    watch.disarm()
            why = failure()
            if why is not None or error is not None:
                done.set_exception(ZenCommError(why or f"{what} failed: {error}"))
            else:
                done.set_result(None)
            del work, done
    watch.stop()
