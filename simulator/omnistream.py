"""OmniReduce's streaming protocol at the paper's setting: the per-block costs its byte-faithful emulation
(baselines/omnireduce.py: one push all-to-all, one pull all-gather) leaves out, measured or sourced.

- The aggregator's work per block. Every block a worker pushes is added into its block's accumulator and the
  worker's announced next offset is kept for the minimum; OmniReduce's aggregator does this on CPU threads
  (`AGGREGATOR_THREADS`). `measure` times it on this machine (one thread: 256 fp32 added into an accumulator
  chosen by block id, and the running minimum of the next offsets), and `priced` charges each rank, as an
  aggregator, the blocks its push received, as CPU spent alongside the push's transfers (`Comm.cpu_s`).
- The columns' round trips. A column advances one block per round trip (the workers' blocks for the current
  offset in, the sum and the next offset out), and a worker keeps `COLUMNS` blocks in flight per aggregator:
  an aggregator's union blocks take at least ceil(U_j / COLUMNS) round trips however fast the link.
  `round_trip_floor` gives that time, to set against the link time of the pull it bounds.

Sources of the protocol's constants: OmniReduce's public code (github.com/sands-lab/omnireduce, omnireduce-RDMA):
example/omnireduce.cfg sets num_threads = 8 and message_size = block_size = 256 (one block a message, which
direct GPU memory requires, params.cpp), and params.hpp gives every thread QPNUM_FACTOR = 8 slots per
aggregator (setNumSlotsPerThread), each slot one column's block in flight.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace

from simulator.schedule import Comm, Item
from zen.types import Measured

BLOCK = 256  # elements a block (the paper's and OmniReduce's default)
AGGREGATOR_THREADS = 8  # omnireduce.cfg num_threads
COLUMNS = AGGREGATOR_THREADS * 8  # blocks in flight per worker and aggregator: threads x QPNUM_FACTOR slots


def block_bytes(value_bytes: int = 4) -> int:
    """A block on the wire: its values and the 4-byte next offset (baselines/omnireduce.py's message)."""
    return BLOCK * value_bytes + 4


@dataclass(frozen=True)
class BlockCost(Measured):
    aggregate_s: float  # one thread's CPU to add one pushed block into its accumulator and track its next offset
    source: str = ""



def measure(workers: int = 16, blocks: int = 8192, repeats: int = 15) -> BlockCost:
    """The aggregator's work per pushed block on this machine, one thread: `workers` workers' blocks at shuffled
    ids added into `blocks` accumulators (index_add_ by block id, as an aggregator adds what arrives) and the
    minimum of their next offsets kept; the median over repeats of the thread's CPU time, per block."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        acc = torch.zeros(blocks, BLOCK)
        pushed = torch.randn(workers, blocks, BLOCK, generator=gen)
        ids = torch.stack([torch.randperm(blocks, generator=gen) for _ in range(workers)])
        nxt = torch.randint(0, 1 << 30, (workers, blocks), dtype=torch.int32, generator=gen)
        times = []
        for i in range(repeats + 2):
            acc.zero_()
            low = torch.full((blocks,), 1 << 30, dtype=torch.int32)
            start = time.thread_time()
            for w in range(workers):
                acc.index_add_(0, ids[w], pushed[w])
                low.scatter_reduce_(0, ids[w], nxt[w], "amin")
            if i >= 2:
                times.append(time.thread_time() - start)
    finally:
        torch.set_num_threads(threads)
    per_block = statistics.median(times) / (workers * blocks)
    return BlockCost(per_block, f"measured here: one thread, {workers} workers x {blocks} blocks of {BLOCK} fp32 "
                                f"added by block id with the next offsets' minimum, median of {repeats}")


def push_blocks(items: list[Item], value_bytes: int = 4) -> int:
    """Blocks a rank received as an aggregator in its push (the all-to-all's payload; headers are a few bytes
    a message, far below a block)."""
    got = sum(sum(i.recvs.values()) for i in items if isinstance(i, Comm) and i.kind == "all_to_all")
    return got // block_bytes(value_bytes)


def union_blocks(items: list[Item], value_bytes: int = 4) -> int:
    """Union blocks a rank served as an aggregator in its pull (its all-gather's message to one peer)."""
    sent = [max(i.sends.values(), default=0) for i in items if isinstance(i, Comm) and i.kind == "all_gather_bytes"]
    return max(sent, default=0) // block_bytes(value_bytes)


def block_messages(items: list[Item], value_bytes: int = 4) -> int:
    """Blocks a rank sends and receives in its push and pull: OmniReduce's messages, one block each."""
    moved = sum(sum(i.sends.values()) + sum(i.recvs.values()) for i in items
                if isinstance(i, Comm) and i.kind in ("all_to_all", "all_gather_bytes"))
    return moved // block_bytes(value_bytes)


def priced(items: list[Item], cost: BlockCost, value_bytes: int = 4) -> list[Item]:
    """One rank's recorded OmniReduce call with its aggregator's work per pushed block on the push (the largest
    all-to-all), shared by its `AGGREGATOR_THREADS` threads, as CPU spent alongside the transfers."""
    pushes = [k for k, i in enumerate(items) if isinstance(i, Comm) and i.kind == "all_to_all"]
    if not pushes:
        return list(items)
    at = max(pushes, key=lambda k: sum(items[k].recvs.values()))  # type: ignore[union-attr]
    work = push_blocks(items, value_bytes) * cost.aggregate_s / AGGREGATOR_THREADS
    out = list(items)
    out[at] = replace(items[at], cpu_s=items[at].cpu_s + work)  # type: ignore[type-var]
    return out


def round_trip_floor(items: list[Item], latency_s: float, value_bytes: int = 4) -> float:
    """Seconds the columns' round trips take an aggregator at least: ceil(union blocks / COLUMNS) round trips of
    two messages' latency each."""
    rounds = -(-union_blocks(items, value_bytes) // COLUMNS)
    return rounds * 2 * latency_s
