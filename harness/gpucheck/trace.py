"""Stream overlap from a torch.profiler Chrome trace (`prof.export_chrome_trace`): which device work ran on
which stream, and how much of the hook's lane work ran while backward's stream was busy.

Profiler events carry no stream attribute in Python (`FunctionEvent` has none); the exported trace does:
each kernel, copy and memset is a complete event ("ph": "X", "cat": "kernel" / "gpu_memcpy" / "gpu_memset")
with "ts" and "dur" in microseconds and its CUDA stream in args["stream"] (and as "tid"). The profiler's
stream numbers are not torch's `Stream.stream_id`, so the check names its streams in the trace itself: it runs
a marker kernel (`torch.cuda._sleep`'s `spin_kernel`) on backward's stream first, then on each lane stream.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from harness.gpucheck.table import require

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
MARKER = "spin_kernel"  # torch.cuda._sleep's kernel
MIN_CONCURRENT = 0.1  # of the lane's device time, overlapping backward's: the overlap check's bar


@dataclass(frozen=True)
class Work:
    """One kernel, copy or memset on the device's timeline (microseconds)."""

    stream: int
    start: float
    end: float
    name: str


def _stream(event: dict[str, Any]) -> int | None:
    stream = (event.get("args") or {}).get("stream")
    if isinstance(stream, int):
        return stream
    tid = event.get("tid")
    if isinstance(tid, int):
        return tid
    match = re.fullmatch(r"stream (\d+)\b.*", str(tid))
    return int(match.group(1)) if match else None


def device_work(trace: dict[str, Any]) -> list[Work]:
    """Every kernel, copy and memset of a Chrome trace, in start order; one without a stream is a ValueError
    (the overlap would silently miss it)."""
    work = []
    for event in trace.get("traceEvents", []):
        if event.get("ph") != "X" or event.get("cat") not in DEVICE_CATEGORIES:
            continue
        stream = _stream(event)
        if stream is None:
            raise ValueError(f"trace: device event {event.get('name')!r} names no stream")
        start = float(event["ts"])
        work.append(Work(stream, start, start + float(event.get("dur", 0.0)), str(event.get("name", ""))))
    return sorted(work, key=lambda w: w.start)


def merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of intervals as disjoint ones, ascending."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def covered(intervals: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in merged(intervals))


def common(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of the time covered by both interval sets."""
    total, rest = 0.0, merged(b)
    for start, end in merged(a):
        total += sum(max(0.0, min(end, e) - max(start, s)) for s, e in rest)
    return total


@dataclass(frozen=True)
class Overlap:
    """Backward's stream and the lane streams in one profiled backward (ms of device time)."""

    lane_streams: tuple[int, ...]
    backward_ms: float
    lane_ms: float
    concurrent_ms: float

    @property
    def fraction(self) -> float:
        return self.concurrent_ms / self.lane_ms if self.lane_ms else 0.0


def overlap(trace: dict[str, Any], marker: str = MARKER) -> Overlap:
    """The overlap of lane work with backward's: the first marker's stream is backward's, the later markers'
    streams (other than backward's) are the lanes'; the markers themselves are not counted."""
    work = device_work(trace)
    marks = [w.stream for w in work if marker in w.name]
    if not marks:
        names = sorted({w.name for w in work})[:8]
        raise ValueError(f"trace: no {marker!r} marker kernel among {len(work)} device events ({names})")
    backward, lanes = marks[0], tuple(sorted(set(marks[1:]) - {marks[0]}))
    real = [w for w in work if marker not in w.name]
    ours = [(w.start, w.end) for w in real if w.stream == backward]
    theirs = [(w.start, w.end) for w in real if w.stream in lanes]
    return Overlap(lanes, covered(ours) / 1e3, covered(theirs) / 1e3, common(ours, theirs) / 1e3)


def judge_overlap(result: Overlap) -> str:
    """The overlap check: the hook's lanes work on streams of their own, and at least MIN_CONCURRENT of their
    device time runs while backward's stream is busy. Returns the detail; CheckFailed when it fails."""
    lanes = ", ".join(map(str, result.lane_streams)) or "none apart from backward's"
    detail = (f"lane streams {lanes}: {result.lane_ms:.2f} ms of device work, {result.concurrent_ms:.2f} ms "
              f"({100 * result.fraction:.0f}%) while backward's stream was busy ({result.backward_ms:.2f} ms)")
    require(bool(result.lane_streams) and result.lane_ms > 0, f"no lane work on a stream of its own: {detail}")
    require(result.fraction >= MIN_CONCURRENT, f"lane work barely overlaps backward: {detail}")
    return detail
