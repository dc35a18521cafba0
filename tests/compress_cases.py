"""Bodies of real DDP ranks for tests/test_compress.py: a model trained through the hook with a compressor,
recording on each rank exactly what its compressor chose to send (a spy on the compressor instance), so the
test can hold the synchronized gradient against the float64 mean of those choices."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import zen


def _spy(state: zen.ZenHookState, sent: list[torch.Tensor]) -> None:
    """Record the part's buffer right after the compressor overwrote it with what it sends."""
    comp = state.runtime.compressor
    assert comp is not None
    name = "quantize" if comp.own_exchange else "compress"
    original = getattr(comp, name)

    def spy(tensor: torch.Tensor, ctx: Any) -> Any:
        result = original(tensor, ctx)
        sent.append(tensor.detach().clone().view(-1))
        return result

    setattr(comp, name, spy)


def chosen_sums(scheme: str, compress: str, steps: int = 3, density: float = 0.1) -> dict[str, Any]:
    """One dense parameter (one bucket, one part): per step the hook's mean gradient and this rank's sent
    tensor; and the residual norms the step records carry."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Linear(50, 37, bias=False)
    wrapped = DDP(model)
    state = zen.ZenHookState(scheme=scheme, compress=compress, density=density, sparse_params=[])
    wrapped.register_comm_hook(state, zen.ddp_hook)
    sent: list[torch.Tensor] = []
    _spy(state, sent)
    gen = torch.Generator().manual_seed(10 + rank)
    grads, residuals = [], []
    for _ in range(steps):
        model.zero_grad()
        x = torch.randn(6, 50, generator=gen) * (1 + rank)
        wrapped(x).pow(2).mean().backward()
        grads.append(model.weight.grad.detach().clone().view(-1))
        residuals.append([s.extra.get("residual_norm") for s in state.last_step.stats if s.extra])
    per_rank: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, torch.stack(sent))
    expected = torch.stack(per_rank).double().sum(0) / dist.get_world_size()
    return {"grads": torch.stack(grads), "expected": expected, "residuals": residuals}


def every_case(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [chosen_sums(**case) for case in cases]
