"""Bodies of real ranks for tests/test_torchrec.py: a small model with torchrec collections sharded by
DistributedModelParallel, trained as a torchrec user would, with torchrec's own data-parallel wrapping or
Zen's. An EmbeddingBagCollection of three tables of two widths (one flat fbgemm weight holds them back to
back) and an EmbeddingCollection of two, ids from a Zipf law, a dense layer on top."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection, EmbeddingConfig, KeyedJaggedTensor

from workloads.torchrec_mode import shard
from zen.integrations.torchrec import ZenDataParallelWrapper, check_torchrec

BAGS = {"t0": (120, 8), "t1": (60, 4), "t2": (90, 8)}  # name: (rows, width)
SEQS = {"s0": (80, 4), "s1": (50, 4)}  # an EmbeddingCollection's tables share one width
BATCH = 6


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ebc = EmbeddingBagCollection(tables=[
            EmbeddingBagConfig(name=n, embedding_dim=d, num_embeddings=r, feature_names=[f"f_{n}"])
            for n, (r, d) in BAGS.items()])
        self.ec = EmbeddingCollection(tables=[
            EmbeddingConfig(name=n, embedding_dim=d, num_embeddings=r, feature_names=[f"f_{n}"])
            for n, (r, d) in SEQS.items()])
        self.head = nn.Linear(sum(d for _, d in BAGS.values()) + 4, 1)

    def forward(self, bags: KeyedJaggedTensor, seqs: KeyedJaggedTensor) -> torch.Tensor:
        pooled = self.ebc(bags).values()
        seq = self.ec(seqs)
        tokens = sum(seq[f"f_{n}"].values().sum(0) for n in SEQS)
        return self.head(torch.cat([pooled, tokens.expand(pooled.shape[0], -1)], dim=1)).squeeze(1)


def _ids(tables: dict[str, tuple[int, int]], gen: torch.Generator, per_sample: int) -> KeyedJaggedTensor:
    """`per_sample` Zipf ids per sample and table."""
    values = []
    for rows, _ in tables.values():
        zipf = 1.0 / torch.arange(1, rows + 1, dtype=torch.float64) ** 1.1
        values.append(torch.multinomial(zipf, BATCH * per_sample, replacement=True, generator=gen))
    return KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f_{n}" for n in tables], values=torch.cat(values),
        lengths=torch.full((len(tables) * BATCH,), per_sample, dtype=torch.int32))


def batches(steps: int) -> list[tuple[KeyedJaggedTensor, KeyedJaggedTensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1000 + dist.get_rank())
    return [(_ids(BAGS, gen, 3), _ids(SEQS, gen, 1), torch.rand(BATCH, generator=gen)) for _ in range(steps)]


def train(scheme: str, plan: str = "dp", steps: int = 5, hook: dict[str, Any] | None = None) -> dict[str, Any]:
    """`steps` SGD steps; returns every parameter this rank holds (by name) and, for Zen, each table's last-step
    record: its rows touched on this rank and the bytes it received."""
    torch.manual_seed(0)
    model = Model()
    dmp, optimizer, wrapper = shard(model, plan, scheme, torch.device("cpu"), lr=0.5, hook=hook)
    for bags, seqs, target in batches(steps):
        optimizer.zero_grad()
        loss = ((dmp(bags, seqs) - target) ** 2).mean()
        loss.backward()
        optimizer.step()
    params = {name: p.detach().clone() for name, p in dmp.named_parameters()}
    record = wrapper.last_step() if isinstance(wrapper, ZenDataParallelWrapper) else None
    parts = [(s.nnz, s.traffic.bytes_received, sparse) for s, sparse in record.parts] if record else []
    return {"params": params, "parts": parts, "states": sorted(getattr(wrapper, "states", {}))}


def variants(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [train(**case) for case in cases]


def refused(version: str) -> str:
    """What the version check says about `version`."""
    try:
        check_torchrec(version)
    except RuntimeError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "accepted"
