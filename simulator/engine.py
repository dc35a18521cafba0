"""Runs a step's streams on SimGrid and reads the clock (paper section 6's settings, simulated).

Every rank's streams become SimGrid actors on the rank's network host; local work migrates the actor to the
rank's processor for its duration (the emulated cluster's shared cores), messages are SimGrid communications
between the ranks' hosts, events are SimGrid semaphores. Collectives expand into their algorithm's messages:
a ring all-reduce (reduce-scatter then all-gather, 2(P-1) steps of one chunk, chunks cut as
`zen.comm.base.ring_chunk` cuts them) and the fixed all-gather as Bruck rounds or a ring.

SimGrid keeps one engine per process, so each simulation runs in a fresh interpreter (`python -m
simulator.engine`, the job pickled in a file); an error inside an actor aborts that process, never the caller.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import TYPE_CHECKING

from simulator.platform import SPEED, Platform
from simulator.schedule import P2P, Comm, Compute, Signal, StepResult, Stream, Wait

if TYPE_CHECKING:
    import simgrid

Round = tuple[list[tuple[int, int]], list[int], float]  # (sends: (peer, bytes), receives: peers, extra latency)


def ring_chunk(numel: int, world_size: int, rank: int) -> int:
    """Elements of chunk `rank` when a ring cuts `numel` into `world_size` pieces: zen.comm.base.ring_chunk's rule,
    restated because the engine's worker interpreter (one per simulation) never imports zen, whose import of torch
    would cost each simulation ten times its start; tests/test_simulator.py holds the two equal."""
    base, rem = divmod(numel, world_size)
    return base + (1 if rank < rem else 0)


def rounds(op: Comm, rank: int, world: int, platform: Platform) -> Iterator[Round]:
    """The message rounds of one primitive on `rank`: each round's sends and receives are posted together
    and the next round starts when all of them are done (then after the round's extra latency). On machines
    of several GPUs an all-reduce runs as NCCL's across machines (`_two_level_all_reduce`); with
    `platform.collapse` a ring's steps go as one flow (`_ring`)."""
    if op.kind in P2P:
        yield sorted(op.sends.items()), sorted(op.recvs), 0.0
        return
    if op.kind == "all_reduce" and platform.gpus_per_node > 1 and op.group is None:
        yield from _two_level_all_reduce(op, rank, world, platform)
        return
    members = op.group or tuple(range(world))
    size, me = len(members), members.index(rank)
    for sends, recvs, extra in _group_rounds(op, me, size, platform, platform.latency_s):
        yield [(members[p], b) for p, b in sends], [members[p] for p in recvs], extra


def _ring(steps: list[int], nxt: int, prv: int, collapse: bool, hop_s: float) -> Iterator[Round]:
    """A ring's steps, `steps[s]` bytes to `nxt` and as many from `prv` at step s. Collapsed: one flow of their
    sum, then the other steps' latency: on a full-bisection switch with the ring's links shared alike, the
    same time as step by step (each step's chunk crosses the same link at the same share) with one message
    instead of many (tests/test_simulator.py holds the two against each other)."""
    if collapse and steps:
        yield [(nxt, sum(steps))], [prv], (len(steps) - 1) * hop_s
        return
    for nbytes in steps:
        yield [(nxt, nbytes)], [prv], 0.0


def _group_rounds(op: Comm, rank: int, world: int, platform: Platform, hop_s: float) -> Iterator[Round]:
    """A collective's rounds in the positions of its group."""
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    if op.kind == "all_reduce":  # position p reduces (then owns) chunk p: it sends chunk p-1-s first
        numel = op.nbytes // op.itemsize
        steps = [ring_chunk(numel, world, (rank - 1 - s) % world) * op.itemsize for s in range(2 * (world - 1))]
        yield from _ring(steps, nxt, prv, platform.collapse, hop_s)
        return
    if platform.all_gather == "ring":
        yield from _ring([op.nbytes] * (world - 1), nxt, prv, platform.collapse, hop_s)
        return
    dist = 1
    while dist < world:  # Bruck: ceil(log2 P) rounds, round k moves min(2^k, P - 2^k) blocks
        yield [((rank - dist) % world, min(dist, world - dist) * op.nbytes)], [(rank + dist) % world], 0.0
        dist *= 2


def _two_level_all_reduce(op: Comm, rank: int, world: int, platform: Platform) -> Iterator[Round]:
    """A ring reduce-scatter inside the machine, a ring all-reduce of the GPU's 1/gpus across machines (one
    ring per local rank), a ring all-gather inside: the NIC carries 2 (n-1)/n of the tensor, as a flat ring's."""
    gpus = platform.gpus_per_node
    node, local = divmod(rank, gpus)
    nodes = world // gpus
    numel = op.nbytes // op.itemsize
    nxt, prv = node * gpus + (local + 1) % gpus, node * gpus + (local - 1) % gpus
    inside = platform.intra_latency_s
    yield from _ring([ring_chunk(numel, gpus, (local - 1 - s) % gpus) * op.itemsize for s in range(gpus - 1)],
                     nxt, prv, platform.collapse, inside)
    shard = ring_chunk(numel, gpus, local)
    up, down = ((node + 1) % nodes) * gpus + local, ((node - 1) % nodes) * gpus + local
    yield from _ring([ring_chunk(shard, nodes, (node - 1 - s) % nodes) * op.itemsize for s in range(2 * (nodes - 1))],
                     up, down, platform.collapse, platform.latency_s)
    yield from _ring([ring_chunk(numel, gpus, (local - s) % gpus) * op.itemsize for s in range(gpus - 1)],
                     nxt, prv, platform.collapse, inside)


def run_step(platform: Platform, streams: Sequence[Stream]) -> StepResult:
    """One step on a fresh SimGrid engine, in a worker process."""
    return run_steps([(platform, list(streams))])[0]


def run_steps(jobs: Sequence[tuple[Platform, list[Stream]]], workers: int = 1) -> list[StepResult]:
    """Several independent simulations, each in an interpreter of its own (`workers` at a time)."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(_run, jobs))


def _run(job: tuple[Platform, list[Stream]]) -> StepResult:
    with TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "platform.xml").write_text(job[0].xml)
        (folder / "job.pkl").write_bytes(pickle.dumps(job))
        done = subprocess.run([sys.executable, "-m", "simulator.engine", tmp], capture_output=True, text=True)
        if done.returncode != 0 or not (folder / "result.pkl").exists():
            raise RuntimeError(f"the SimGrid run of {job[0].name} failed (rc {done.returncode}): "
                               f"{done.stderr.strip()[-2000:]}")
        return pickle.loads((folder / "result.pkl").read_bytes())


def run_here(platform: Platform, streams: Sequence[Stream], xml: Path) -> StepResult:
    """Build the engine in this process (once per process: SimGrid's rule) and run the streams."""
    from simgrid import Actor, Engine, Host

    args = [sys.argv[0] or "simulator", "--log=root.thres:critical", "--cfg=contexts/factory:thread"]
    engine = Engine(args + [f"--cfg={c}" for c in platform.config])
    engine.load_platform(str(xml))
    step = _Step(platform)
    hosts = {name: Host.by_name(name) for name in {*platform.net_hosts, *platform.cpu_hosts}}
    for s in streams:
        net, cpu = hosts[platform.net_hosts[s.rank]], hosts[platform.cpu_hosts[s.rank]]
        Actor.create(f"{s.rank}:{s.name}", net, step.body, s, net, cpu)
    engine.run()
    return step.result()


class _Step:
    """What one step's actors share: the events between a rank's streams, the messages counted per sender and
    receiver, when each rank's main stream ended and the spans its communication streams were busy."""

    def __init__(self, platform: Platform) -> None:
        import simgrid

        self.platform = platform
        self.events: dict[tuple[int, str], simgrid.Semaphore] = defaultdict(lambda: simgrid.Semaphore(0))
        self.counters: dict[tuple, int] = defaultdict(int)
        self.ends: dict[int, float] = {}
        self.busy: dict[int, list[tuple[float, float]]] = defaultdict(list)
        self.messages = 0

    def mailbox(self, call: str, src: int, dst: int, side: str) -> simgrid.Mailbox:
        """The k-th message from src to dst in `call`, k counted on each side (as a transport orders them)."""
        from simgrid import Mailbox

        key = (call, src, dst, side)
        k = self.counters[key]
        self.counters[key] = k + 1
        return Mailbox.by_name(f"{call}|{src}>{dst}|{k}")

    @staticmethod
    def spend(cpu: simgrid.Host, seconds: float) -> simgrid.Semaphore:
        """`seconds` of work on `cpu` by a helper actor (an execution the caller starts on another host never
        ends in this SimGrid's Python binding); the semaphore is released when it is done."""
        import simgrid
        from simgrid import Actor, this_actor

        done = simgrid.Semaphore(0)

        def work() -> None:
            this_actor.execute(seconds * SPEED)
            done.release()

        Actor.create("cpu", cpu, work)
        return done

    def communicate(self, stream: Stream, op: Comm, cpu: simgrid.Host) -> None:
        import simgrid
        from simgrid import this_actor

        r = stream.rank
        steps = list(rounds(op, r, self.platform.world_size, self.platform))
        for sends, recvs, extra in steps:
            pending, keep = [], []
            work = None
            if op.cpu_s > 0:  # the round's share of the messages' CPU, on the rank's processor, alongside
                work = self.spend(cpu, op.cpu_s / len(steps))
            for peer, nbytes in sends:
                pending.append(self.mailbox(op.call, r, peer, "send").put_async(None, int(nbytes)))
                self.messages += 1
            for peer in recvs:
                comm, data = self.mailbox(op.call, peer, r, "recv").get_async()
                pending.append(comm)
                keep.append(data)
            simgrid.Comm.wait_all(pending)
            for data in keep:
                data.get()
            if work is not None:
                work.acquire()
            if extra > 0:
                this_actor.sleep_for(extra)

    def body(self, stream: Stream, net: simgrid.Host, cpu: simgrid.Host) -> None:
        """One stream's items in order: compute on the rank's processor, primitives, events."""
        from simgrid import Engine, this_actor

        for item in stream.items:
            if isinstance(item, Compute):
                if item.seconds > 0:
                    if cpu is not net:
                        this_actor.set_host(cpu)
                    this_actor.execute(item.seconds * SPEED)
                    if cpu is not net:
                        this_actor.set_host(net)
            elif isinstance(item, Comm):
                start = Engine.clock
                self.communicate(stream, item, cpu)
                if stream.comm:
                    self.busy[stream.rank].append((start, Engine.clock))
            elif isinstance(item, Signal):
                self.events[stream.rank, item.event].release()
            elif isinstance(item, Wait):
                self.events[stream.rank, item.event].acquire()
        if stream.main:
            self.ends[stream.rank] = Engine.clock

    def result(self) -> StepResult:
        world = self.platform.world_size
        rank_end = [self.ends.get(r, 0.0) for r in range(world)]
        return StepResult(max(rank_end, default=0.0), rank_end, [_union(self.busy[r]) for r in range(world)],
                          self.messages)


def _union(spans: list[tuple[float, float]]) -> float:
    """Length of the union of time spans."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


if __name__ == "__main__":
    work = Path(sys.argv[1])
    plat, items = pickle.loads((work / "job.pkl").read_bytes())
    result = run_here(plat, items, work / "platform.xml")
    (work / "result.pkl").write_bytes(pickle.dumps(result))
