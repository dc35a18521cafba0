"""DDP communication hook: sends each gradient bucket through a Zen scheme (or a baseline).

Usage: `ddp.register_comm_hook(ZenHookState(scheme="zen"), zen.ddp_hook)`. Buckets arrive
un-averaged; like DDP's own allreduce hook we return the mean unless `average=False`. State is
keyed by tensor size, not bucket index, so DDP's bucket rebuild after iteration 1 is harmless.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from zen.api import _cached_scheme, _dist_comm, sync
from zen.types import SyncStats


@dataclass
class ZenHookState:
    """Hyper-parameters plus the stats of the current step (bytes per bucket)."""

    scheme: str = "zen"
    group: dist.ProcessGroup | None = None
    options: dict[str, Any] = field(default_factory=dict)
    average: bool = True
    validate: bool = True
    route: Callable[[dist.GradBucket], str] | None = None  # per-bucket scheme, same on every rank
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
    name = state.route(bucket) if state.route is not None else state.scheme
    comm = _dist_comm(state.group, None)
    scheme = _cached_scheme(name, state.group, state.options)
    out = buffer if buffer.layout == torch.strided else None
    result, stats = sync(scheme, buffer, comm, out=out, validate=state.validate)
    if state.average:
        result.div_(comm.world_size)
    state.step_stats.append(stats)
    if bucket.is_last():
        state.iteration += 1
        state.last_step_stats, state.step_stats = state.step_stats, []
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(result)
    return fut
