"""A user's own DDP training script with the Zen hook: what a practitioner writes, nothing from zen.train.

A 200k-row nn.Embedding plus a 200k-row nn.EmbeddingBag (dense or `--sparse` gradients) and a small MLP on
Zipf-distributed ids. `--hook ddp` is DDP's built-in allreduce (sparse allreduce for COO gradients),
`--hook zen` registers `zen.ddp_hook` with the embeddings routed through the Zen scheme, `--hook allreduce`
the hook with dense allreduce for everything. Run it as a user would:

    torchrun --standalone --nproc-per-node 2 scripts/ddp_user_script.py --hook zen --sparse

or through `scripts/ddp_user_bench.py`, which runs every variant in one launch (loopback or emulated links).
Prints (rank 0) the median and spread of the step time over the steps after the warm-up.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import zen

HOOKS = ("ddp", "allreduce", "zen")


class DenseNet(nn.Module):
    """A model whose gradients are all dense (an MLP of ~50M parameters): the hook must not cost it anything."""

    def __init__(self, width: int = 2048, depth: int = 12):
        super().__init__()
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        self.body = nn.Sequential(*layers, nn.Linear(width, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).squeeze(1)


class Recommender(nn.Module):
    def __init__(self, rows: int, dim: int, sparse: bool):
        super().__init__()
        self.items = nn.Embedding(rows, dim, sparse=sparse)
        self.users = nn.EmbeddingBag(rows, dim, mode="sum", sparse=sparse)
        self.mlp = nn.Sequential(nn.Linear(2 * dim, 256), nn.ReLU(), nn.Linear(256, 1))

    def forward(self, items: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
        return self.mlp(torch.cat([self.items(items), self.users(history)], dim=1)).squeeze(1)


def zipf_ids(gen: torch.Generator, rows: int, shape: tuple[int, ...], s: float = 1.1) -> torch.Tensor:
    """Bounded Zipf ids (frequent ids low, as real vocabularies): inverse-CDF on a power law."""
    u = torch.rand(shape, generator=gen, dtype=torch.float64)
    ids = (rows ** (1 - s) - 1) * u + 1
    return (ids ** (1 / (1 - s))).long().clamp(1, rows) - 1


def train(hook: str, sparse: bool, steps: int = 30, warmup: int = 5, rows: int = 200_000, dim: int = 64,
          batch: int = 512, history: int = 20, seed: int = 0, model_name: str = "recommender",
          device: str = "cpu") -> dict[str, Any]:
    """Train `steps` steps; returns step times (s), losses and a parameter checksum (same on every rank).
    `device="cuda"` trains on the GPU with gloo moving CUDA tensors (ranks may share one GPU)."""
    rank = dist.get_rank()
    torch.manual_seed(seed)
    model = (Recommender(rows, dim, sparse) if model_name == "recommender" else DenseNet()).to(device)
    ddp = DDP(model, device_ids=[torch.device(device).index or 0] if device.startswith("cuda") else None)
    if hook != "ddp":
        state = zen.ZenHookState(scheme="zen" if hook == "zen" else "allreduce", sparse_params=model)
        ddp.register_comm_hook(state, zen.ddp_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(seed * 1000 + rank)
    times, losses = [], []
    for _ in range(steps):
        items = zipf_ids(gen, rows, (batch,))
        hist = zipf_ids(gen, rows, (batch, history))
        target = (items < 100).float()
        inputs = (items, hist) if model_name == "recommender" else (torch.randn(64, 2048, generator=gen),)
        inputs = tuple(x.to(device) for x in inputs)
        target = target[: len(inputs[0])].to(device)
        start = time.perf_counter()
        loss = nn.functional.binary_cross_entropy_with_logits(ddp(*inputs), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if device != "cpu":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        losses.append(float(loss))
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    return {"hook": hook, "sparse": sparse, "times": times[warmup:], "losses": losses, "checksum": checksum}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hook", choices=HOOKS, default="zen")
    parser.add_argument("--sparse", action="store_true", help="nn.Embedding(sparse=True) gradients (COO)")
    parser.add_argument("--model", choices=("recommender", "dense"), default="recommender",
                        help="dense: an MLP whose gradients are all dense")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args(argv)
    if args.steps <= args.warmup:
        parser.error("--steps must exceed --warmup")
    dist.init_process_group("gloo")
    try:
        result = train(args.hook, args.sparse, args.steps, args.warmup, model_name=args.model)
    finally:
        dist.destroy_process_group()
    if os.environ.get("RANK", "0") == "0":
        t = sorted(result["times"])
        print(f"hook={args.hook} sparse={args.sparse}: median {statistics.median(t) * 1e3:.2f} ms/step "
              f"(min {t[0] * 1e3:.2f}, max {t[-1] * 1e3:.2f}), final loss {result['losses'][-1]:.5f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
