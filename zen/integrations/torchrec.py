"""torchrec: Zen for DistributedModelParallel's data-parallel tables, with one argument.

    dmp = DistributedModelParallel(model, ..., data_parallel_wrapper=ZenDataParallelWrapper(scheme="zen"))

Why a data-parallel wrapper is the place: a table sharded DATA_PARALLEL is synchronized by a DDP that torchrec
builds inside the sharded collection (its `init_data_parallel`: 25 MB buckets, static graph, no hook), not by
the outer DDP that DMP's data-parallel wrapper makes (that one skips every sharded parameter). So torchrec's
dense fp32 allreduce, and never its `allreduce_comm_precision`, reaches those tables. The wrapper does torchrec's
default wrapping, then registers Zen's DDP hook (public API only: `ZenHookState`, `ddp_hook`,
`register_comm_hook`) on each of those inner DDPs, and with `sync_dense=True` on the outer DDP too. Each inner
DDP holds one flat fbgemm weight with tables of different widths back to back; the hook's router
(zen.ddp.router.TableLayout) cuts it at the table views `named_parameters()` yields, by storage offset, so each
table goes as rows of its own width and nothing is read from fbgemm's private fields.

Process groups: every hooked DDP of one DMP shares one process group, made here. That is correct because each
hook synchronizes its bucket inside the hook call (`asynchronous=False`): all their collectives are issued
from backward's thread in backward's order, the same on every rank, so they cannot interleave differently on
two ranks. It costs no overlap: a data-parallel table's gradient is the last one backward computes, and dense
parts stay asynchronous all-reduces. It is not torchrec's own group, whose collectives (a pipelined next
batch's input distribution) may come from another thread.

Every torchrec internal this relies on is named in `INTERNALS`, and `check_torchrec` refuses a torchrec
version whose layout it does not know (`TorchrecLayoutError`, raised alike on every rank).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torchrec
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torchrec.distributed.embedding import ShardedEmbeddingCollection
from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection
from torchrec.distributed.model_parallel import DefaultDataParallelWrapper, DistributedModelParallel
from torchrec.distributed.types import ShardingEnv

from zen.ddp import StepRecord, ZenHookState, ddp_hook
from zen.ddp.router import register_table_finder

KNOWN_VERSIONS = ("1.8", "1.9")  # 1.8 run here; 1.9 read from its source: the same internals
LOOKUPS = "_lookups"
COLLECTIONS = (ShardedEmbeddingBagCollection, ShardedEmbeddingCollection)  # their fused variants subclass them
INTERNALS = (
    f"ShardedEmbeddingBagCollection.{LOOKUPS} and ShardedEmbeddingCollection.{LOOKUPS} (their fused subclasses "
    f"included): a list whose entry for the tables sharded DATA_PARALLEL is the DistributedDataParallel that "
    f"their init_data_parallel builds",
    "the table parameters a sharded collection's named_parameters() yields (TableBatchedEmbeddingSlice) are "
    "(rows, width) views that tile the storage of that DDP's flat fbgemm weights",
    "DefaultDataParallelWrapper.wrap makes the outer DDP over every unsharded parameter, a submodule of the DMP",
)
WRAPPER_OWNS = {  # hook settings the wrapper decides, and why
    "group": "the hooked DDPs share one process group made by the wrapper",
    "asynchronous": "sharing that group is correct only with every bucket synchronized inside its hook call",
    "lanes": "one group, one lane",
    "sparse_params": "the tables are found from the sharded model",
    "ranks_per_node": "two-level sync needs the default group, and the wrapper's group is another",
}


class TorchrecLayoutError(RuntimeError):
    """torchrec is laid out in a way this integration does not know."""


def check_torchrec(version: str | None = None) -> None:
    """TorchrecLayoutError unless `version` (default: the installed one) is one whose internals are known."""
    version = torchrec.__version__ if version is None else version
    if ".".join(version.split(".")[:2]) not in KNOWN_VERSIONS:
        raise TorchrecLayoutError(
            f"zen: torchrec {version} is not a version whose internals zen.integrations.torchrec knows "
            f"({', '.join(KNOWN_VERSIONS)}). It relies on: " + "; ".join(INTERNALS) + ". Check them in that "
            "version's source, then add it to KNOWN_VERSIONS.")


def sharded_collections(model: nn.Module) -> list[tuple[str, nn.Module, list[DistributedDataParallel]]]:
    """(path, sharded collection, the DDPs of its data-parallel tables) for every sharded embedding collection
    inside `model` (a DMP or any module holding sharded collections); TorchrecLayoutError on an unknown layout."""
    root = model.module if isinstance(model, DistributedModelParallel) else model
    found = []
    for path, module in root.named_modules():
        if not isinstance(module, COLLECTIONS):
            continue
        check_torchrec()
        lookups = getattr(module, LOOKUPS, None)
        if not isinstance(lookups, list):
            raise TorchrecLayoutError(f"zen: {type(module).__name__} at {path!r} has no list {LOOKUPS!r} (torchrec "
                                      f"{torchrec.__version__}); zen relies on: " + "; ".join(INTERNALS))
        found.append((path, module, [m for m in lookups if isinstance(m, DistributedDataParallel)]))
    return found


def named_tables(collection: nn.Module, ddps: list[DistributedDataParallel]) -> list[tuple[str, torch.Tensor]]:
    """The table views of `collection` that lie in the flat weights of `ddps`, checked to tile them exactly."""
    storages = {p.untyped_storage().data_ptr(): p for ddp in ddps for p in ddp.parameters()}
    tables = [(name, p) for name, p in collection.named_parameters()
              if p.dim() == 2 and p.untyped_storage().data_ptr() in storages]
    covered = sum(p.numel() for _, p in tables)
    total = sum(p.numel() for p in storages.values())
    if covered != total:
        raise TorchrecLayoutError(f"zen: the table views of {type(collection).__name__} cover {covered} of the "
                                  f"{total} elements of its data-parallel weights (torchrec {torchrec.__version__}); "
                                  f"zen relies on: " + "; ".join(INTERNALS))
    return tables


@register_table_finder
def data_parallel_tables(model: nn.Module) -> list[torch.Tensor]:
    """Every data-parallel table of a torchrec-sharded model, as its (rows, width) view (what
    `zen.embedding_params` adds for a sharded model); none for a model without sharded collections."""
    return [p for _, collection, ddps in sharded_collections(model) for _, p in named_tables(collection, ddps)]


class ZenDataParallelWrapper(DefaultDataParallelWrapper):
    """DMP's data-parallel wrapper with Zen on the data-parallel tables: torchrec's default wrapping (its
    arguments as in DefaultDataParallelWrapper), then Zen's hook with `scheme` and `hook` settings (those of
    ZenHookState but the ones in WRAPPER_OWNS) on every DDP of data-parallel tables, and with `sync_dense`
    on the outer DDP of the dense parameters too (in place of torchrec's allreduce, so its bytes are counted
    and `compress=` reaches them). `states` maps each hooked DDP (the path of its sharded collection, or
    "dense") to its hook state, whose `last_step` holds what the last step sent and received."""

    def __init__(self, scheme: str = "zen", *, sync_dense: bool = False, bucket_cap_mb: int = 25,
                 static_graph: bool = True, find_unused_parameters: bool = False,
                 allreduce_comm_precision: str | None = None, params_to_ignore: list[str] | None = None,
                 ddp_kwargs: dict[str, Any] | None = None, **hook: Any):
        check_torchrec()
        owned = sorted(set(hook) & set(WRAPPER_OWNS))
        if owned:
            raise ValueError("zen: ZenDataParallelWrapper sets " + "; ".join(f"{k} ({WRAPPER_OWNS[k]})" for k in owned))
        if sync_dense and allreduce_comm_precision is not None:
            raise ValueError("zen: sync_dense=True replaces the dense DDP's allreduce, so allreduce_comm_precision "
                             "would not apply; choose one")
        ZenHookState(scheme=scheme, **hook)  # an unknown scheme or a bad setting fails here, not inside DMP
        super().__init__(bucket_cap_mb=bucket_cap_mb, static_graph=static_graph,
                         find_unused_parameters=find_unused_parameters,
                         allreduce_comm_precision=allreduce_comm_precision, params_to_ignore=params_to_ignore,
                         ddp_kwargs=ddp_kwargs)
        self.scheme, self.sync_dense, self.hook = scheme, sync_dense, hook
        self.states: dict[str, ZenHookState] = {}

    def wrap(self, dmp: DistributedModelParallel, env: ShardingEnv, device: torch.device) -> None:
        super().wrap(dmp, env, device)
        targets = self._targets(dmp)
        if not targets:
            return
        assert env.process_group is not None  # the default wrapping refused a group-less environment
        group = dist.new_group(ranks=dist.get_process_group_ranks(env.process_group), use_local_synchronization=True)
        for name, ddp in targets:
            state = ZenHookState(scheme=self.scheme, group=group, sparse_params=dmp, asynchronous=False, **self.hook)
            try:
                ddp.register_comm_hook(state, ddp_hook)
            except RuntimeError as exc:  # DDP takes one hook: a fused collection's optimizer already is its hook
                raise TorchrecLayoutError(
                    f"zen: the DDP of {name!r} already has a communication hook ({exc}). torchrec's fused "
                    f"collections (FusedEmbeddingBagCollection, FusedEmbeddingCollection) run their optimizer as "
                    f"that hook, so Zen cannot take its place: use the plain collection with an optimizer "
                    f"outside the model for data-parallel tables") from exc
            self.states[name] = state

    def _targets(self, dmp: DistributedModelParallel) -> list[tuple[str, DistributedDataParallel]]:
        targets = []
        for path, _, ddps in sharded_collections(dmp):
            targets += [(path if len(ddps) == 1 else f"{path}.{LOOKUPS}.{i}", ddp) for i, ddp in enumerate(ddps)]
        if self.sync_dense:
            outer = next((m for m in dmp.modules() if isinstance(m, DistributedDataParallel)), None)
            targets += [("dense", outer)] if outer is not None else []
        return targets

    def last_step(self) -> StepRecord:
        """The last step of every hooked DDP as one record (parts and spans of all of them)."""
        return StepRecord(parts=[p for s in self.states.values() for p in s.last_step.parts],
                          spans=[x for s in self.states.values() for x in s.last_step.spans])
