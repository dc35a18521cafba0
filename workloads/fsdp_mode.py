"""`zen train --fsdp`: the workload sharded by FSDP2 (`fully_shard`) instead of replicated under DDP.

Every scheme shards the model alike: each embedding module (the workload's `sparse_params`) as its own FSDP
module, each item of every nn.ModuleList (a transformer's blocks), then the model. Schemes: `fsdp` is FSDP's own
reduce-scatter (dense), `fsdp-bf16` the same with its bf16 reduce (`MixedPrecisionPolicy(reduce_dtype=bf16)`), and
zen.fsdp's (`zen`: each destination's non-zero rows, or its dense chunk where cheaper; `dense`: every chunk dense
through the same counted communicator). `--compress` applies to zen.fsdp's schemes only, on every group but the
embeddings' (their natural sparsity), as under DDP.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import zen.fsdp
from workloads.base import Workload
from zen.integrations.fsdp import slots, table_units

FSDP, FSDP_BF16 = "fsdp", "fsdp-bf16"
BASELINES = (FSDP, FSDP_BF16)
DELTA = "zen-delta"  # zen's reduce-scatter and the all-gather of changed rows (zen.integrations.fsdp_gather)
COMPRESSED = ("zen", DELTA)  # the schemes --compress applies to


def is_scheme(name: str) -> bool:
    return name in schemes()


def schemes() -> list[str]:
    return [*zen.fsdp.SCHEMES, DELTA, *BASELINES]


class Sharded(nn.Module):
    """The FSDP-sharded model under `.module` (as DDP and DMP keep theirs), called as it is."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)


def shard(work: Workload, model: nn.Module, scheme: str, device: torch.device, squeeze: dict[str, Any]
          ) -> tuple[Sharded, zen.fsdp.ZenFSDP | None]:
    """`model` sharded for `scheme`; with zen.fsdp's runtime (its `last_step` counts the bytes) for Zen's schemes.
    `squeeze`: the compressor's settings (compress, density, compress_options) or none."""
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(reduce_dtype=torch.bfloat16 if scheme == FSDP_BF16 else None)
    named = dict(model.named_parameters())
    tables = {id(named[n]) for n in work.sparse_params}
    for module in _units(model, tables):
        fully_shard(module, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    state = None
    if scheme not in BASELINES:
        named = dict(model.named_parameters())  # FSDP's sharded parameters, under the same names
        state = zen.fsdp.shard(model, scheme="zen" if scheme == DELTA else scheme, gather="delta" if scheme == DELTA
                               else None, sparse_params=[named[n] for n in work.sparse_params], **squeeze)
    return Sharded(model), state


def _units(model: nn.Module, tables: set[int]) -> list[nn.Module]:
    """The modules sharded on their own, innermost first: the largest modules of embedding tables of one width
    (zen.integrations.fsdp.table_units: dlrm's collection is one group, not 26), then the items of every
    nn.ModuleList (the blocks of a transformer)."""
    owners = table_units(model, slots(model, tables))
    blocks = [item for m in model.modules() if isinstance(m, nn.ModuleList) for item in m
              if any(True for _ in item.parameters()) and item not in owners]
    return [*owners, *blocks]
