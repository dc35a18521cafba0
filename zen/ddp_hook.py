"""DDP communication hook: sends each gradient bucket through a Zen scheme (or a baseline).

Usage: `ddp.register_comm_hook(ZenHookState(scheme="zen"), zen.ddp_hook)`. Buckets arrive
un-averaged; like DDP's own allreduce hook we return the mean unless `average=False`. State is
keyed by tensor size, not bucket index, so DDP's bucket rebuild after iteration 1 is harmless.
`route` may split a bucket into parts (e.g. embedding rows through Zen, the rest dense, paper §5 step 1).
No `from __future__ import annotations` here: DDP's register_comm_hook compares the hook's annotations
with the real classes and rejects strings.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from zen.api import _cached_scheme, _dist_comm, sync
from zen.types import SyncStats

# (input tensor, dense view of the bucket buffer that receives the result or None, scheme name)
Part = tuple[torch.Tensor, torch.Tensor | None, str]


@dataclass
class ZenHookState:
    """Hyper-parameters plus the stats of the current step (bytes per bucket)."""

    scheme: str = "zen"
    group: dist.ProcessGroup | None = None
    options: dict[str, Any] = field(default_factory=dict)
    average: bool = True
    validate: bool = True
    # per-bucket scheme, same on every rank: one name for the whole bucket, or Parts covering it
    route: Callable[[dist.GradBucket], str | list[Part]] | None = None
    iteration: int = 0
    step_stats: list[SyncStats] = field(default_factory=list)
    last_step_stats: list[SyncStats] = field(default_factory=list)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["group"] = None
        return state

    def bytes_received_last_step(self) -> int:
        return sum(s.traffic.bytes_received for s in self.last_step_stats)


def ddp_hook(state: ZenHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """hook(state, bucket) -> Future of the synchronized bucket buffer."""
    buffer = bucket.buffer()
    routed = state.route(bucket) if state.route is not None else state.scheme
    if isinstance(routed, str):
        result = _sync_part(state, buffer, buffer if buffer.layout == torch.strided else None, routed)
        if buffer.layout == torch.sparse_coo:  # DDP copy_()s the result into the sparse .grad
            result = result.to_sparse(buffer.sparse_dim())
    else:
        for tensor, out, name in routed:
            _sync_part(state, tensor, out, name)
        result = buffer
    if bucket.is_last():
        state.iteration += 1
        state.last_step_stats, state.step_stats = state.step_stats, []
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(result)
    return fut


def _sync_part(state: ZenHookState, tensor: torch.Tensor, out: torch.Tensor | None,
               name: str) -> torch.Tensor:
    comm = _dist_comm(state.group, None)
    result, stats = sync(_cached_scheme(name, state.group, state.options), tensor, comm, out=out,
                         validate=state.validate, divisor=comm.world_size if state.average else 1)
    state.step_stats.append(stats)
    return result
