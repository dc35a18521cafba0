"""`zen train --torchrec PLAN`: a workload's embedding collections sharded by torchrec's
DistributedModelParallel, as torchrec users run them, instead of the whole model under one DDP.

Plans: `dp`, every table DATA_PARALLEL (each rank holds every table, synchronized by the DDP torchrec builds
for them); `mixed`, the largest table TABLE_WISE on rank 0 (model parallel: torchrec's all-to-alls, its
optimizer fused into backward) and the rest DATA_PARALLEL. Schemes: `torchrec` is what a torchrec user gets
(DefaultDataParallelWrapper: dense allreduce of the tables and of the dense model); `torchrec-fp16` its fp16
option (`allreduce_comm_precision`, which only reaches the dense model's DDP: the tables' DDP is torchrec's
own); `none` every DDP with PyTorch's no-op hook (compute-only headroom); any registered Zen scheme through
ZenDataParallelWrapper (`sync_dense=True`: the dense model's DDP through the hook too, so every byte is
counted).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook
from torch.nn.parallel import DistributedDataParallel
from torchrec import EmbeddingBagCollection, EmbeddingCollection
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DefaultDataParallelWrapper, DistributedModelParallel
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, data_parallel, table_wise
from torchrec.distributed.types import ShardingEnv, ShardingPlan
from torchrec.optim.optimizers import in_backward_optimizer_filter

import zen
from zen.ddp import StepRecord
from zen.integrations.torchrec import ZenDataParallelWrapper, sharded_collections

PLANS = ("dp", "mixed")
NO_COMM, TORCHREC, TORCHREC_FP16 = "none", "torchrec", "torchrec-fp16"
BASELINES = (NO_COMM, TORCHREC, TORCHREC_FP16)


def is_scheme(name: str) -> bool:
    return name in BASELINES or name in zen.schemes()


def table_sizes(model: nn.Module) -> dict[str, dict[str, int]]:
    """Per EmbeddingBagCollection / EmbeddingCollection path, its tables' row counts."""
    found = {}
    for path, module in model.named_modules():
        if isinstance(module, EmbeddingBagCollection):
            found[path] = {t.name: t.num_embeddings for t in module.embedding_bag_configs()}
        elif isinstance(module, EmbeddingCollection):
            found[path] = {t.name: t.num_embeddings for t in module.embedding_configs()}
    return found


def sharding_plan(model: nn.Module, plan: str, world_size: int, device: torch.device,
                  lr: float) -> tuple[ShardingPlan, list[Any]]:
    """(torchrec ShardingPlan, sharders) for `plan`; the table-wise table (`mixed`) trains with fused SGD at `lr`
    (torchrec's model-parallel kernels fuse their optimizer into backward)."""
    if plan not in PLANS:
        raise ValueError(f"unknown torchrec plan {plan!r}; choose one of: {', '.join(PLANS)}")
    sizes = table_sizes(model)
    if not sizes:
        raise ValueError("the model has no torchrec EmbeddingBagCollection or EmbeddingCollection to shard")
    fused = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": lr}
    sharders = [EmbeddingBagCollectionSharder(fused_params=fused), EmbeddingCollectionSharder(fused_params=fused)]
    largest = max(((n, path, name) for path, tables in sizes.items() for name, n in tables.items()))
    modules = dict(model.named_modules())
    plans = {}
    for path, tables in sizes.items():
        per_table = {name: table_wise(rank=0) if plan == "mixed" and (path, name) == largest[1:] else data_parallel()
                     for name in tables}
        sharder = sharders[0] if isinstance(modules[path], EmbeddingBagCollection) else sharders[1]
        plans[path] = construct_module_sharding_plan(modules[path], per_table, sharder=sharder, local_size=world_size,
                                                     world_size=world_size, device_type=device.type)
    return ShardingPlan(plans), sharders


class NoCommWrapper(DefaultDataParallelWrapper):
    """torchrec's wrapping with PyTorch's no-op hook on every DDP: what a step costs without communication."""

    def wrap(self, dmp: DistributedModelParallel, env: ShardingEnv, device: torch.device) -> None:
        super().wrap(dmp, env, device)
        ddps = [ddp for _, _, found in sharded_collections(dmp) for ddp in found]
        ddps += [m for m in dmp.modules() if isinstance(m, DistributedDataParallel)][:1]
        for ddp in ddps:
            ddp.register_comm_hook(None, noop_hook)


def wrapper_for(scheme: str, hook: dict[str, Any]) -> DefaultDataParallelWrapper:
    """torchrec's data-parallel wrapper that makes `scheme`."""
    if scheme == TORCHREC:
        return DefaultDataParallelWrapper()
    if scheme == TORCHREC_FP16:
        return DefaultDataParallelWrapper(allreduce_comm_precision="fp16")
    if scheme == NO_COMM:
        return NoCommWrapper()
    return ZenDataParallelWrapper(scheme, sync_dense=True, **hook)


def shard(model: nn.Module, plan: str, wrapper: DefaultDataParallelWrapper, device: torch.device,
          lr: float) -> tuple[DistributedModelParallel, torch.optim.Optimizer]:
    """(DMP, optimizer) of `model` under `plan`, wrapped by `wrapper`, as a torchrec user builds them: the optimizer
    is SGD at `lr` over every parameter not trained inside backward (a table-wise table's fused SGD is)."""
    torchrec_plan, sharders = sharding_plan(model, plan, dist.get_world_size(), device, lr)
    dmp = DistributedModelParallel(model, env=ShardingEnv.from_process_group(dist.group.WORLD), device=device,
                                   plan=torchrec_plan, sharders=sharders, data_parallel_wrapper=wrapper)
    params = [p for _, p in in_backward_optimizer_filter(dmp.named_parameters())]
    return dmp, torch.optim.SGD(params, lr=lr)


def step_records(wrapper: DefaultDataParallelWrapper) -> Callable[[], StepRecord] | None:
    """What reads the Zen hooks' record of the last step (None for torchrec's own wrapping and the no-op hook)."""
    return wrapper.last_step if isinstance(wrapper, ZenDataParallelWrapper) else None
