"""Adversarial inputs shared by the simulated and the multi-process tests.

Each case builds one tensor per rank; the float64 reference is their dense sum."""

from __future__ import annotations

from collections.abc import Callable

import torch

Case = Callable[[int, int, torch.dtype], torch.Tensor]  # (rank, world_size, dtype) -> tensor
M = 997  # prime, so no partition or block size divides it


def _dense(idx: torch.Tensor, rank: int, dtype: torch.dtype, numel: int = M) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + rank)
    t = torch.zeros(numel, dtype=torch.float64)
    values = torch.randn(idx.numel(), generator=g, dtype=torch.float64) + 0.5
    values[values.to(dtype) == 0] = 1.0  # the chosen rows stay non-zero after the cast; all others stay zero
    t[idx] = values
    return t.to(dtype)


def random_case(rank: int, P: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(rank * 7 + 3)
    return _dense(torch.randperm(M, generator=g)[:37], rank, dtype)


def edges_case(rank: int, P: int, dtype: torch.dtype) -> torch.Tensor:
    """Index 0 and the last index on every rank, plus a few others."""
    return _dense(torch.tensor([0, M - 1, rank % M, (5 * rank + 11) % M]).unique(), rank, dtype)


def empty_ranks_case(rank: int, P: int, dtype: torch.dtype) -> torch.Tensor:
    """Every other rank has no non-zeros at all (rank 0 too)."""
    if rank % 2 == 0:
        return torch.zeros(M, dtype=dtype)
    return random_case(rank, P, dtype)


def all_empty_case(rank: int, P: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(M, dtype=dtype)


def identical_case(rank: int, P: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(99)
    return _dense(torch.randperm(M, generator=g)[:50], rank, dtype)


def disjoint_case(rank: int, P: int, dtype: torch.dtype) -> torch.Tensor:
    return _dense(torch.arange(rank, M, P)[:20], rank, dtype)


def full_case(rank: int, P: int, dtype: torch.dtype) -> torch.Tensor:
    return _dense(torch.arange(M), rank, dtype)


def matrix_case(rank: int, P: int, dtype: torch.dtype) -> torch.Tensor:
    """A 2-D dense tensor (an embedding-table gradient with a few rows touched)."""
    g = torch.Generator().manual_seed(rank + 5)
    t = torch.zeros(61, 7, dtype=torch.float64)
    rows = torch.randperm(61, generator=g)[:6]
    t[rows] = torch.randn(6, 7, generator=g, dtype=torch.float64)
    t[0, 3] = 2.0 + rank
    return t.to(dtype)


def coo_case(rank: int, P: int, dtype: torch.dtype) -> torch.Tensor:
    """Sparse COO rows with duplicates, as nn.Embedding(sparse=True) produces (row 0 included)."""
    g = torch.Generator().manual_seed(rank + 41)
    rows = torch.cat([torch.tensor([0, 0, 60]), torch.randint(0, 61, (9,), generator=g)])
    values = torch.randn(rows.numel(), 5, generator=g, dtype=torch.float64).to(dtype)
    return torch.sparse_coo_tensor(rows.view(1, -1), values, (61, 5), check_invariants=True)


def skewed_nodes(seed: int, nodes: int, k: int, rows: int, width: int
                  ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(every node's rows, every rank's tensor): each node's halves of the rows at their own random density, so the
    shard groups' busiest nodes differ; a node's rows are dealt to its k ranks (row % k), values non-zero."""
    g = torch.Generator().manual_seed(seed)
    node_sets, tensors = [], []
    for _ in range(nodes):
        density = torch.rand(2, generator=g) ** 3
        ids = torch.arange(rows)
        node = ids[torch.rand(rows, generator=g) < density[(ids >= rows // 2).long()]]
        node_sets.append(node)
        for i in range(k):
            mine = node[node % k == i]
            t = torch.zeros(rows, width)
            t[mine] = torch.rand(len(mine), width, generator=g) + 0.5
            tensors.append(t)
    return node_sets, tensors


CASES: dict[str, Case] = {
    "random": random_case, "edges": edges_case, "empty_ranks": empty_ranks_case, "all_empty": all_empty_case,
    "identical": identical_case, "disjoint": disjoint_case, "full": full_case, "matrix": matrix_case,
    "coo": coo_case,
}
