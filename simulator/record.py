"""A recording communicator: each scheme's message schedule for one call, taken from the real scheme code.

`RecordingComm` is the in-process simulated group's communicator (zen.comm.sim.SimComm) with its backend
primitives wrapped: whatever primitive the communicator uses (an exchange round's all-to-all of one packed
buffer, an all-gather of bytes, a ring all-reduce, waited for or issued, a fixed all-gather) is written down
as the bytes it sends to and receives from each peer, exactly the wire buffers, headers included; zero-byte
entries are not messages (gloo posts nothing for them). So the counted collectives above it (zen.comm.base),
and any scheme, are recorded without being re-derived, and the record adds up to the bytes the communicator
counted.

The local work between two primitives is timed too: the virtual ranks pass a baton, so exactly one of them
runs at a time (on one thread, as each rank of `zen train` runs: OMP_NUM_THREADS=1), and the time from
leaving one primitive to entering the next, in the thread's CPU time (so other processes on the machine do not
stretch it), is that rank's own work for that stretch of the scheme.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence

import torch

from simulator.schedule import Comm, Compute, Item
from zen.comm.sim import SimComm, SimGroup
from zen.core import Part, SyncConfig
from zen.core.build import build
from zen.registry import Scheme
from zen.types import Traffic

RankFn = Callable[[SimComm, int], object]


class Baton:
    """One virtual rank computes at a time; `items[r]` is what rank r did, in order."""

    def __init__(self, world: int, call: str):
        self.lock = threading.Lock()
        self.items: list[list[Item]] = [[] for _ in range(world)]
        self.resumed = [0.0] * world
        self.call = call

    def hold(self, rank: int) -> None:
        self.lock.acquire()
        self.resumed[rank] = time.thread_time()

    def release(self, rank: int) -> None:
        self.items[rank].append(Compute(time.thread_time() - self.resumed[rank]))
        self.lock.release()


class RecordingComm(SimComm):
    """A virtual rank whose primitives are written down (bytes per peer) and whose local work is timed."""

    def __init__(self, group: SimGroup, rank: int, baton: Baton, device: torch.device | str = "cpu"):
        super().__init__(group, rank, device)
        self.baton = baton

    def _note(self, kind: str, sends: dict[int, int], recvs: dict[int, int], nbytes: int = 0,
              itemsize: int = 4) -> None:
        self.baton.items[self.rank].append(Comm(kind, self.baton.call, {j: b for j, b in sends.items() if b},
                                                {j: b for j, b in recvs.items() if b}, nbytes, itemsize))

    def _around(self, fn: Callable[[], object]) -> object:
        self.baton.release(self.rank)
        try:
            return fn()
        finally:
            self.baton.hold(self.rank)

    def _all_reduce(self, tensor: torch.Tensor) -> None:
        self._around(lambda: super(RecordingComm, self)._all_reduce(tensor))
        self._note("all_reduce", {}, {}, tensor.numel() * tensor.element_size(), tensor.element_size())

    def _all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        out = self._around(lambda: super(RecordingComm, self)._all_gather(tensor))
        self._note("all_gather", {}, {}, tensor.numel() * tensor.element_size(), tensor.element_size())
        return out

    def _all_to_all(self, send: torch.Tensor, send_sizes: list[int], recv_sizes: list[int]) -> torch.Tensor:
        out = self._around(lambda: super(RecordingComm, self)._all_to_all(send, send_sizes, recv_sizes))
        others = [j for j in range(self.world_size) if j != self.rank]
        self._note("all_to_all", {j: send_sizes[j] for j in others}, {j: recv_sizes[j] for j in others})
        return out  # type: ignore[return-value]

    def _all_gather_bytes(self, buf: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
        out = self._around(lambda: super(RecordingComm, self)._all_gather_bytes(buf, sizes))
        others = [j for j in range(self.world_size) if j != self.rank]
        self._note("all_gather_bytes", {j: int(buf.numel()) for j in others}, {j: int(sizes[j]) for j in others})
        return out  # type: ignore[return-value]


def record_once(fn: RankFn, world: int, call: str, seed: int = 0) -> tuple[list[list[Item]], list[object]]:
    """Run fn(comm, rank) on `world` virtual ranks, one at a time between primitives: each rank's items and
    what fn returned on it. The communicator is set up first (its shared seed agreed, unrecorded), as a
    training job's is once before its first step: replayed every step, that agreement would charge hash
    partitions a round the steps never take."""
    group = SimGroup(world, seed=seed)
    baton = Baton(world, call)

    def body(rank: int) -> object:
        comm = RecordingComm(group, rank, baton)
        baton.hold(rank)
        try:
            comm.shared_seed()  # a step runs on a communicator set up long before: its one agreement is not the step's
            baton.items[rank].clear()
            baton.resumed[rank] = time.thread_time()
            return fn(comm, rank)
        finally:
            baton.release(rank)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        results = group.run(body)
    finally:
        torch.set_num_threads(threads)
    return baton.items, results


def record(make_fn: Callable[[], RankFn], world: int, call: str, repeats: int = 3, warmup: int = 2, seed: int = 0
           ) -> list[list[Item]]:
    """`record_once` of a fresh `make_fn()` (fresh input copies, made before the clock runs) after `warmup`
    unrecorded runs (a scheme's first calls measure and choose), `repeats` times: the same primitives each
    time, local work as the median of the repeats (a noisy machine)."""
    for _ in range(warmup):
        record_once(make_fn(), world, call, seed)
    runs = [record_once(make_fn(), world, call, seed)[0] for _ in range(max(1, repeats))]
    return [_median_items([run[r] for run in runs]) for r in range(world)]


def _median_items(runs: Sequence[list[Item]]) -> list[Item]:
    first = runs[0]
    for other in runs[1:]:
        if [type(i) for i in other] != [type(i) for i in first] or \
                [i for i in other if isinstance(i, Comm)] != [i for i in first if isinstance(i, Comm)]:
            raise RuntimeError("a repeated call moved other bytes: its schedule is not stable enough to record")
    out: list[Item] = []
    for k, item in enumerate(first):
        if isinstance(item, Compute):
            out.append(Compute(statistics.median(run[k].seconds for run in runs)))  # type: ignore[union-attr]
        else:
            out.append(item)
    return out


def counted(items: list[Item], rank: int, world: int) -> tuple[int, int]:
    """(bytes sent, bytes received) of one rank's record, counted as zen.comm.base counts them: a ring
    all-reduce moves 2 (numel - own chunk) elements each way, a fixed all-gather its block to every peer."""
    sent = received = 0
    for item in items:
        if not isinstance(item, Comm):
            continue
        if item.kind == "all_reduce":
            numel = item.nbytes // item.itemsize
            base, rem = divmod(numel, world)
            own = base + (1 if rank < rem else 0)
            sent += 2 * (numel - own) * item.itemsize
            received += 2 * (numel - own) * item.itemsize
        elif item.kind == "all_gather":
            sent += (world - 1) * item.nbytes
            received += (world - 1) * item.nbytes
        else:
            sent += sum(item.sends.values())
            received += sum(item.recvs.values())
    return sent, received


def part_call(scheme: str | None, originals: Sequence[torch.Tensor], divisor: int,
              instances: Sequence[Scheme] | None = None) -> Callable[[], RankFn]:
    """`make_fn` of one bucket part as the DDP hook syncs it (zen.ddp.hook): the synchronizer's call on the
    part as a view of the bucket, in place, after the first steps (no input check, sizes agreed), the mean
    divided on the way. `scheme` with one instance per rank (`instances`, so a scheme's per-size state
    persists across calls): the table's rows through it; None: a dense part, the asynchronous all-reduce
    (waited for). Each rank returns the call's Traffic (the communicator's count)."""
    config = SyncConfig(scheme=scheme or "allreduce", nonfinite="pass", validate=False, sizes_agreed=True)

    def make() -> RankFn:
        work = [t.clone() for t in originals]

        def fn(comm: SimComm, rank: int) -> Traffic:
            instance = instances[rank] if instances is not None else None
            part = Part(work[rank], rows=scheme is not None, sparse=scheme is not None, key="part",
                        out=work[rank])
            (outcome,) = build(config, comm, instance=instance).run([part], divisor=divisor).outcomes
            if outcome.pending is not None:
                outcome.pending.wait()
            return outcome.stats.traffic

        return fn

    return make
