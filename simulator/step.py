"""One training step as streams (simulator.schedule): the timeline's compute on each rank's main stream, the
DDP hook's lanes running the recorded calls of each bucket's parts, the dense parts' asynchronous all-reduces.

What the real step does (zen.ddp, workloads/train.py): backward hands bucket k to lane k mod `lanes` when it is
ready; the lane issues the bucket's dense parts as one asynchronous all-reduce each (they queue on the lane's
process group) and runs the scheme on its embedding parts in order; backward returns when its own work is done
and every bucket's future has completed; then the optimizer. `none` (no-op hook) only computes; `ddp` (no hook)
all-reduces each whole bucket on one queue. A dense scheme (`allreduce`) sends every part down the dense path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from simulator.schedule import Comm, Compute, Item, Signal, Stream, Wait
from simulator.timeline import Timeline

Calls = Mapping[tuple[int, int], Sequence[Sequence[Item]]]  # (bucket, part) -> per rank: the call's items


def main_stream(rank: int, t: Timeline, waits: Sequence[str]) -> Stream:
    items: list[Item] = [Compute(t.forward_s)]
    elapsed = 0.0
    for k, bucket in enumerate(t.buckets):
        items += [Compute(max(0.0, bucket.ready_s - elapsed)), Signal(f"ready{k}")]
        elapsed = max(elapsed, bucket.ready_s)
    items.append(Compute(max(0.0, t.backward_s - elapsed)))
    items += [Wait(e) for e in waits]
    items.append(Compute(t.optimizer_s))
    return Stream(rank, "main", items, main=True)


def ddp_calls(t: Timeline, world: int) -> Calls:
    """DDP's own communication: each whole bucket's all-reduce, (bucket, 0) -> per rank."""
    return {(k, 0): [[Comm("all_reduce", f"ddp{k}", nbytes=b.nbytes)] for _ in range(world)]
            for k, b in enumerate(t.buckets)}


def step_streams(kind: str, world: int, t: Timeline, calls: Calls | None = None, lanes: int = 2) -> list[Stream]:
    """Every rank's streams for one step. `kind`: "none", "ddp", or "hook" (a scheme through zen's hook: the
    embedding parts' calls in `calls`; dense parts there too, as recorded all-reduces). "ddp" takes its
    buckets' calls from `calls` when given (their messages' CPU priced), else `ddp_calls`."""
    streams: list[Stream] = []
    for r in range(world):
        if kind == "none":
            streams.append(main_stream(r, t, []))
        elif kind == "ddp":
            own = calls if calls is not None else ddp_calls(t, world)
            queue: list[Item] = []
            for k in range(len(t.buckets)):
                queue += [Wait(f"ready{k}"), *own[k, 0][r], Signal(f"done{k}")]
            streams += [main_stream(r, t, [f"done{k}" for k in range(len(t.buckets))]),
                        Stream(r, "ddp", queue, comm=True)]
        else:
            assert calls is not None
            streams += _hook_streams(r, t, calls, lanes)
    return streams


def _hook_streams(r: int, t: Timeline, calls: Calls, lanes: int) -> list[Stream]:
    lane_items: list[list[Item]] = [[] for _ in range(lanes)]
    dense_items: list[list[Item]] = [[] for _ in range(lanes)]
    waits = []
    for k, bucket in enumerate(t.buckets):
        j = k % lanes
        parts = bucket.parts()
        dense = [i for i, _ in enumerate(parts) if (k, i) in calls and _is_dense(calls[k, i][r])]
        sparse = [i for i, _ in enumerate(parts) if (k, i) in calls and i not in dense]
        lane_items[j].append(Wait(f"ready{k}"))
        if dense:
            lane_items[j].append(Signal(f"issue{k}"))
            dense_items[j] += [Wait(f"issue{k}"), *[c for i in dense for c in calls[k, i][r]], Signal(f"dense{k}")]
            waits.append(f"dense{k}")
        for i in sparse:
            lane_items[j] += list(calls[k, i][r])
        lane_items[j].append(Signal(f"sparse{k}"))
        waits.append(f"sparse{k}")
    return [main_stream(r, t, waits),
            *[Stream(r, f"lane{j}", lane_items[j], comm=True) for j in range(lanes)],
            *[Stream(r, f"allreduce{j}", dense_items[j], comm=True) for j in range(lanes) if dense_items[j]]]


def _is_dense(items: Sequence[Item]) -> bool:
    """A dense part's record: one all-reduce (and no local work to speak of around it)."""
    comms = [i for i in items if isinstance(i, Comm)]
    return len(comms) == 1 and comms[0].kind == "all_reduce"
