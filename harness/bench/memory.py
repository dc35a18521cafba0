"""The memory-traffic floor of one sync on this machine: every rank must read its input and write its output
once, whatever the scheme. Measured as P real ranks (sharing the cores, as the benchmark's do) each copying
a tensor of `numel` float32 into another, from a barrier to the slowest rank's end, median over repeats."""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist


def copy_seconds(numel: int, repeats: int = 15) -> list[float]:
    """Rank target of harness.launch.spawn: each repeat's time for this rank to read and write `numel` floats."""
    src = torch.randn(numel)
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeats + 2):
        dist.barrier()
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    return times[2:]


def floor_seconds(world_size: int, numel: int, repeats: int = 15) -> float:
    """Median over repeats of the slowest rank's read-and-write of `numel` float32 (seconds)."""
    from harness.launch import spawn

    per_rank = spawn("harness.bench.memory:copy_seconds", world_size, {"numel": numel, "repeats": repeats})
    return statistics.median(max(r[i] for r in per_rank) for i in range(repeats))
