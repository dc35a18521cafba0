"""Helpers shared by the workloads: independent RNG streams, data-parallel sharding, LM windows."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch


def generator(*key: int) -> torch.Generator:
    """A torch RNG whose stream depends on every element of `key` (e.g. seed, rank, world size).

    numpy's SeedSequence hashes the whole key, so streams of neighbouring keys are independent.
    """
    state = np.random.SeedSequence([int(k) for k in key]).generate_state(2, dtype=np.uint64)
    return torch.Generator().manual_seed(int(state[0] >> np.uint64(1)))


def shard_epochs(num_items: int, rank: int, world_size: int, seed: int) -> Iterator[int]:
    """Endless item indices of one rank, like DistributedSampler(shuffle=True, drop_last=True).

    Every epoch draws one permutation common to all ranks (seeded by seed and epoch); rank r takes
    positions r, r + W, ...: ranks see disjoint items and the stream is deterministic.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world size {world_size}")
    per_rank = num_items // world_size
    if per_rank == 0:
        raise ValueError(f"{num_items} items cannot feed {world_size} ranks")
    epoch = 0
    while True:
        perm = torch.randperm(num_items, generator=generator(seed, epoch, 0x5A4D))
        yield from perm[rank : per_rank * world_size : world_size].tolist()
        epoch += 1


def window_batches(stream: torch.Tensor, length: int, batch_size: int, rank: int, world_size: int,
                   seed: int) -> Iterator[torch.Tensor]:
    """(batch_size, length) int64 windows cut from a token stream into non-overlapping chunks."""
    num_windows = stream.numel() // length
    if num_windows < world_size * batch_size:
        raise ValueError(f"a stream of {stream.numel()} tokens is too short for {world_size} ranks x "
                         f"{batch_size} windows of {length}")
    starts = shard_epochs(num_windows, rank, world_size, seed)
    offsets = torch.arange(length)
    while True:
        first = torch.tensor([next(starts) for _ in range(batch_size)]) * length
        yield stream[first[:, None] + offsets]


def config_dict(cfg: object) -> dict[str, object]:
    """A preset dataclass as plain JSON-able values (tuples become lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in vars(cfg).items()}
