"""Bodies of real DDP ranks for tests/test_ddp.py: a small model with embeddings trained under DDP options
and hook settings, returning losses and a parameter checksum (which must be equal on every rank)."""

from __future__ import annotations

import time
import warnings
from contextlib import nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import zen
from workloads.torch_hooks import NATIVE, register

ROWS = 300


class Model(nn.Module):
    """Two tables (one a bag), a dense layer, and a branch only odd steps use (for find_unused_parameters)."""

    def __init__(self, sparse: bool, branch: bool = False):
        super().__init__()
        self.words = nn.Embedding(ROWS, 8, sparse=sparse)
        self.bag = nn.EmbeddingBag(ROWS // 2, 8, mode="mean", sparse=sparse)
        self.head = nn.Linear(16, 1)
        self.extra = nn.Linear(16, 1) if branch else None

    def forward(self, ids: torch.Tensor, use_extra: bool = False) -> torch.Tensor:
        x = torch.cat([self.words(ids).mean(1), self.bag(ids % (ROWS // 2))], dim=1)
        return self.head(x) + (self.extra(x) if use_extra and self.extra is not None else 0)


def _ids(gen: torch.Generator) -> torch.Tensor:
    zipf = 1.0 / torch.arange(1, ROWS + 1, dtype=torch.float64) ** 1.1
    return torch.multinomial(zipf.expand(12, -1), 5, replacement=True, generator=gen)


def train(scheme: str, sparse: bool = False, steps: int = 8, hook: dict[str, Any] | None = None,
          ddp: dict[str, Any] | None = None, accumulate: int = 1, branch: bool = False) -> dict[str, Any]:
    """`scheme` "ddp" is DDP's built-in allreduce; anything else the Zen hook with `hook` settings. With
    `accumulate` > 1, the first micro-batches of each step run under no_sync; `branch` uses `extra` on odd
    steps only (needs find_unused_parameters)."""
    torch.manual_seed(0)
    model = Model(sparse, branch)
    wrapped = DDP(model, **(ddp or {}))
    state = None
    if scheme != "ddp":
        state = zen.ZenHookState(scheme=scheme, sparse_params=model, **(hook or {}))
        wrapped.register_comm_hook(state, zen.ddp_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + dist.get_rank())
    losses = []
    for i in range(steps):
        opt.zero_grad()
        for micro in range(accumulate):
            ids = _ids(gen)
            target = (ids < 5).float().mean(1, keepdim=True)
            sync = micro == accumulate - 1
            with nullcontext() if sync else wrapped.no_sync():
                loss = ((wrapped(ids, use_extra=branch and i % 2 == 1) - target) ** 2).mean()
                loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / dist.get_world_size())
    checksum = float(sum(p.detach().double().sum() * (k + 1) for k, p in enumerate(model.parameters())))
    phases = sorted({p for s in state.last_step.stats for p in s.traffic.received}) if state else []
    return {"losses": losses, "checksum": checksum, "phases": phases}


def variants(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [train(**case) for case in cases]


def failing_step(kind: str, timeout_s: float = 3.0) -> str:
    """One bad step on one rank; returns what backward raised on this rank ("no error" if nothing)."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Model(sparse=False)
    wrapped = DDP(model)
    nonfinite = "raise" if kind == "nan" else "pass"
    state = zen.ZenHookState(scheme="zen", sparse_params=model, nonfinite=nonfinite, timeout_s=timeout_s)
    wrapped.register_comm_hook(state, zen.ddp_hook)
    ids = _ids(torch.Generator().manual_seed(rank))
    for _ in range(2):  # good steps first: the hook has its process group, DDP has rebuilt its buckets
        wrapped(ids).sum().backward()
    scale = float("nan") if kind == "nan" and rank == 1 else 1.0
    if kind == "inf_passes":
        scale = float("inf") if rank == 1 else 1.0
    out = wrapped(ids)
    if kind == "frozen" and rank == 1:  # stuck inside backward, before its first bucket is ready
        out.register_hook(lambda grad: (time.sleep(3 * timeout_s), grad)[1])
    start = time.monotonic()
    try:
        (out.sum() * scale).backward()
    except Exception as exc:  # noqa: BLE001 - the test reads the message
        return f"{type(exc).__name__} after {time.monotonic() - start:.1f}s: {exc}"
    if kind == "inf_passes":
        return "passed" if not bool(torch.isfinite(model.head.weight.grad).all()) else "finite"
    return "no error"


def builtin_warnings(sparse: bool) -> list[str]:
    """The warnings `zen train` gives when DDP's built-in all-reduce (`ddp`) is registered on this model."""
    ddp = DDP(Model(sparse))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        register(ddp, NATIVE)
    return [str(w.message) for w in caught]


def builtin_warnings_of(cases: list[bool]) -> list[list[str]]:
    """builtin_warnings of a sparse and a dense model in one launch (each caught from a fresh filter)."""
    return [builtin_warnings(sparse) for sparse in cases]
