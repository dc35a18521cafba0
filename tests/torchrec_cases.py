"""Bodies of real ranks for tests/test_torchrec.py: a small model with torchrec collections sharded by
DistributedModelParallel and trained as a torchrec user's script does, with torchrec's own data-parallel
wrapping or Zen's. An EmbeddingBagCollection of three tables of two widths (one flat fbgemm weight holds them
back to back, neighbours of different widths) and an EmbeddingCollection of two tables of one width, ids from
a Zipf law, a dense layer on top. Every case runs in one spawn (each rank start costs seconds)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection, EmbeddingConfig, KeyedJaggedTensor
from torchrec.distributed.model_parallel import DefaultDataParallelWrapper, DistributedModelParallel
from torchrec.distributed.types import ShardingEnv

import zen
from workloads.torchrec_mode import shard, sharding_plan
from workloads.train import TrainConfig, rank_main
from zen.integrations.torchrec import ZenDataParallelWrapper, check_torchrec, sharded_collections

BAGS = {"t0": (120, 8), "t1": (60, 4), "t2": (90, 8)}  # name: (rows, width)
SEQS = {"s0": (80, 4), "s1": (50, 4)}  # an EmbeddingCollection's tables share one width
BATCH, STEPS, LR = 6, 5, 0.5


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
    """`per_sample` Zipf ids per sample and table (torchrec 1.8's data-parallel EmbeddingCollection on CPU
    wants one)."""
    values = []
    for rows, _ in tables.values():
        zipf = 1.0 / torch.arange(1, rows + 1, dtype=torch.float64) ** 1.1
        values.append(torch.multinomial(zipf, BATCH * per_sample, replacement=True, generator=gen))
    return KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f_{n}" for n in tables], values=torch.cat(values),
        lengths=torch.full((len(tables) * BATCH,), per_sample, dtype=torch.int32))


def _batches() -> list[tuple[KeyedJaggedTensor, KeyedJaggedTensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1000 + dist.get_rank())
    return [(_ids(BAGS, gen, 3), _ids(SEQS, gen, 1), torch.rand(BATCH, generator=gen)) for _ in range(STEPS)]


def _touched(kjt: KeyedJaggedTensor) -> dict[str, list[int]]:
    """The rows a batch looks up per table: exactly its gradient's non-zero rows here (sum pooling)."""
    features = kjt.to_dict()
    return {key.removeprefix("f_"): sorted(set(jt.values().tolist())) for key, jt in features.items()}


def train(wrapper: DefaultDataParallelWrapper, plan: str = "dp") -> tuple[DistributedModelParallel, dict[str, Any]]:
    """A user's script: the model sharded under `plan` with `wrapper`, STEPS SGD steps. Returns the DMP and
    every parameter this rank holds, by name, plus the rows the last batch touched."""
    torch.manual_seed(0)
    dmp, optimizer = shard(Model(), plan, wrapper, torch.device("cpu"), LR)
    for bags, seqs, target in _batches():
        optimizer.zero_grad()
        ((dmp(bags, seqs) - target) ** 2).mean().backward()
        optimizer.step()
    params = {name: p.detach().clone() for name, p in dmp.named_parameters()}
    return dmp, {"params": params, "touched": {**_touched(bags), **_touched(seqs)}}


def _differing(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """Names whose tensors are not bitwise equal (or missing on one side)."""
    return sorted(set(a) ^ set(b)) + [n for n in a if n in b and not torch.equal(a[n], b[n])]


def bitwise(plan: str) -> dict[str, Any]:
    """Plain DMP against Zen with one argument (tables only) and with the dense DDP through Zen too."""
    _, plain = train(DefaultDataParallelWrapper(), plan)
    out: dict[str, Any] = {"names": sorted(plain["params"])}
    for label, wrapper in (("zen", ZenDataParallelWrapper(scheme="zen")),
                           ("zen+dense", ZenDataParallelWrapper(scheme="zen", sync_dense=True))):
        dmp, mine = train(wrapper, plan)
        out[label] = {"differ": _differing(plain["params"], mine["params"]), "states": sorted(wrapper.states),
                      "tables": _table_names(dmp)}
    return out


def _table_names(dmp: DistributedModelParallel) -> list[str]:
    """Names of the parameters zen.embedding_params finds in the sharded model."""
    found = {id(p) for p in zen.embedding_params(dmp)}
    return sorted(name for name, p in dmp.named_parameters() if id(p) in found)


def part_bytes(scheme: str) -> dict[str, Any]:
    """The last step's parts of each hooked table DDP (bytes per phase, rows on this rank) and the rows each
    table's last batch touched on this rank."""
    wrapper = ZenDataParallelWrapper(scheme=scheme)
    _, result = train(wrapper)
    parts = {name: [(dict(s.traffic.received), s.nnz) for s, sparse in state.last_step.parts if sparse]
             for name, state in wrapper.states.items()}
    return {"parts": parts, "touched": result["touched"]}


def refused_layout() -> str:
    """A DDP of data-parallel tables that already has a hook (as torchrec's fused collections register their
    optimizer): the wrapper says why it cannot hook it, on every rank."""
    torch.manual_seed(0)
    dmp = _unwrapped_dmp()
    for _, _, ddps in sharded_collections(dmp):
        for ddp in ddps:
            ddp.register_comm_hook(None, noop_hook)
    try:
        dmp.init_data_parallel()
    except RuntimeError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def _unwrapped_dmp() -> DistributedModelParallel:
    """The model sharded, its data-parallel wrapping not done yet (DMP's init_data_parallel=False)."""
    model = Model()
    plan, sharders = sharding_plan(model, "dp", dist.get_world_size(), torch.device("cpu"), LR)
    return DistributedModelParallel(model, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                    device=torch.device("cpu"), plan=plan, sharders=sharders,
                                    data_parallel_wrapper=ZenDataParallelWrapper(), init_data_parallel=False)


def refused_version(version: str) -> str:
    try:
        check_torchrec(version)
    except RuntimeError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "accepted"


def dlrm_runs(out: str) -> list[dict[str, Any]]:
    """`zen train --workload dlrm --torchrec PLAN` at the tiny preset, both plans, in this spawn."""
    configs = [TrainConfig(workload="dlrm", preset="tiny", schemes=["none", "torchrec", "torchrec-fp16", "zen"],
                           steps=4, warmup=1, torchrec=plan, out=f"{out}/{plan}.json", wandb_mode="disabled")
               for plan in ("dp", "mixed")]
    return [rank_main(asdict(config)) for config in configs]


def everything(out: str) -> dict[str, Any]:
    return {"tables": [BAGS, SEQS], "bitwise": {plan: bitwise(plan) for plan in ("dp", "mixed")},
            "bytes": part_bytes("zen-hc"),
            "refused_layout": refused_layout(), "refused_version": refused_version("2.0.0"),
            "accepted_version": refused_version("1.8.0"), "dlrm": dlrm_runs(out)}
