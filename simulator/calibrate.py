"""This machine's cost of a message, measured on the emulated cluster: what the step simulator adds to the
recorded schedules so that the ranks' sharing of two cores is modelled honestly.

Two ranks in their network namespaces (harness/netem.py) exchange buffers through the communicator's own backend
(zen.comm.dist.DistComm's all-to-all, point to point on gloo) at several sizes: the wall time of an exchange
of a few bytes is the software latency of a message here (Python, gloo's threads, the kernel's veth and shaper), and
the processes' CPU time (every thread, user and system) per exchange, fitted against the bytes, is the CPU a
message and a byte cost the rank beyond its recorded local work. Medians over repeats.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from zen.types import Measured

SIZES = (8, 1 << 20, 8 << 20)


@dataclass(frozen=True)
class MessageCost(Measured):
    latency_s: float  # a message's latency end to end beyond its bytes' time on the link
    cpu_per_message_s: float  # CPU a posted send or receive costs its rank
    cpu_per_byte_s: float  # CPU a byte sent or received costs its rank
    source: str = ""



def probe(repeats: int = 20) -> dict[int, tuple[float, float]]:
    """Rank target (harness.launch.spawn, two ranks): size -> (median wall seconds, median process CPU seconds) of
    one exchange (each rank sends `size` bytes to the other and receives as many)."""
    import torch
    import torch.distributed as dist

    from zen.comm.dist import DistComm

    comm = DistComm()
    peer = 1 - comm.rank
    out = {}
    for size in SIZES:
        buf = torch.ones(size, dtype=torch.uint8)
        walls, cpus = [], []
        for i in range(repeats + 2):
            dist.barrier()
            wall, cpu = time.perf_counter(), time.process_time()
            sizes = [size if j == peer else 0 for j in range(2)]
            comm._all_to_all(buf, sizes, sizes)
            if i >= 2:
                walls.append(time.perf_counter() - wall)
                cpus.append(time.process_time() - cpu)
        out[size] = (statistics.median(walls), statistics.median(cpus))
    return out


def measure(rate: str = "1gbit", repeats: int = 20) -> MessageCost:
    """Spawn the two ranks in the emulated cluster at `rate` and fit the costs (rank 0's view)."""
    from harness.launch import spawn
    from harness.netem import emulated_cluster, parse_rate

    with emulated_cluster(2, rate) as cluster:
        got = spawn("simulator.calibrate:probe", 2, {"repeats": repeats}, **cluster.spawn_kwargs())
    walls = {s: max(g[s][0] for g in got) for s in SIZES}
    cpus = {s: statistics.fmean(g[s][1] for g in got) for s in SIZES}
    small, big = SIZES[0], SIZES[-1]
    per_byte = max(0.0, (cpus[big] - cpus[small]) / (2 * (big - small)))  # each byte is sent once and received once
    per_message = max(0.0, cpus[small] / 2)
    latency = max(0.0, walls[small] - cpus[small])
    link = {s: walls[s] - walls[small] for s in SIZES}
    return MessageCost(latency, per_message, per_byte,
                       f"measured here at {rate}: 2 ranks, exchanges of {list(SIZES)} bytes, median of {repeats}; "
                       f"wall {walls}, CPU {cpus}; {SIZES[-1]} bytes took {link[big]:.4f} s over the small one "
                       f"(link alone: {8 * big / parse_rate(rate):.4f} s)")
