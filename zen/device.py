"""Devices and streams, in one place: which code path a tensor's device takes, the communication stream a lane
works on, the stream dependencies handed to DDP, and clocks that time device work.

Why a module of its own: on a GPU the hook's work must not run on the stream backward computes on (every
host read there would wait for all of backward's queued kernels, and the overlap the hook exists for would be
lost), and DDP must not read a bucket before the communication stream has written it. Both rules live here,
so schemes and the communicator never touch a stream. On the host everything here is a no-op.

`ZEN_EMULATE_ACCELERATOR=1` makes CPU tensors take the accelerator's code path (no native CPU kernels, no
host reads beyond the communicator's counted ones): what the NCCL-rules test backend (tests/nccl_rules.py)
runs, so the GPU path is exercised on a machine without one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch

EMULATE_ENV = "ZEN_EMULATE_ACCELERATOR"


def accelerated(device: torch.device) -> bool:
    """Whether tensors on `device` take the accelerator path: a GPU, or the host under emulation."""
    return device.type != "cpu" or os.environ.get(EMULATE_ENV, "0") == "1"


class Stream:
    """A lane's communication stream on `device` (nothing on the host). `mark()` on the producer's stream
    (DDP's, when it calls the hook) and `waits(mark)` in the lane order the lane's work after backward's
    writes of the bucket without blocking the host."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = torch.cuda.Stream(device=device) if device.type == "cuda" else None

    def mark(self) -> Any:
        """An event recorded now on the calling thread's current stream (None on the host)."""
        if self.cuda is None:
            return None
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event

    def waits(self, mark: Any) -> None:
        if mark is not None and self.cuda is not None:
            self.cuda.wait_event(mark)

    def use(self) -> Any:
        """A context in which the calling thread's work goes to this stream."""
        return torch.cuda.stream(self.cuda) if self.cuda is not None else nullcontext()

    def synchronize(self) -> None:
        """Block the host until this stream's queued work is done (nothing to wait for on the host)."""
        if self.cuda is not None:
            self.cuda.synchronize()

    def keep(self, tensor: torch.Tensor) -> None:
        """`tensor` (allocated on another stream) is used on this one: its memory must not be reused before
        this stream is done with it."""
        if self.cuda is not None and tensor.is_cuda:
            tensor.record_stream(self.cuda)


def join(mark: Any, device: torch.device) -> None:
    """Make the calling thread's current stream on `device` wait for `mark` (a `Stream.mark()` of another
    stream): a Future completed here then carries that stream's work too (a callback's current stream has
    waited only for its parent futures')."""
    if mark is not None and device.type == "cuda":
        torch.cuda.current_stream(device).wait_event(mark)


def result_future(device: torch.device) -> torch.futures.Future:
    """The Future a hook hands DDP: on a GPU one that carries the stream dependency (completing it records
    an event on the completing thread's current stream, and DDP's stream waits for it)."""
    if device.type == "cuda":
        return torch.futures.Future(devices=[device])
    return torch.futures.Future()


class Clock:
    """Times work on a device's timeline: CUDA events on a GPU (read when `seconds` is asked, a host wait),
    the host's monotonic clock elsewhere."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._start: Any = None
        self._end: Any = None

    def start(self) -> Clock:
        self._start = self._stamp()
        return self

    def stop(self) -> Clock:
        self._end = self._stamp()
        return self

    def _stamp(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self) -> float:
        if not self.cuda:
            return float(self._end - self._start)
        self._end.synchronize()
        return self._start.elapsed_time(self._end) / 1e3

    def interval(self, ref: Clock) -> tuple[float, float]:
        """(start, end) in seconds after `ref`'s start (a clock of the same device); an unstopped clock ends
        where it starts."""
        end = self._end if self._end is not None else self._start
        if not self.cuda:
            return float(self._start - ref._start), float(end - ref._start)
        end.synchronize()
        return ref._start.elapsed_time(self._start) / 1e3, ref._start.elapsed_time(end) / 1e3


@contextmanager
def on(device: torch.device) -> Iterator[None]:
    """Make `device` current for the calling thread (a lane thread starts on device 0)."""
    if device.type == "cuda":
        with torch.cuda.device(device):
            yield
    else:
        yield
