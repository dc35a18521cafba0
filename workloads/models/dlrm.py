"""DLRM (torchrec.models.dlrm.DLRM) on a synthetic Criteo-like click log: the paper's
recommendation workload (Zen §6: DeepFM on Criteo, 214M parameters, per-GPU density 2.80% at batch
1024).

The 26 embedding tables are plain data-parallel modules (an unsharded EmbeddingBagCollection, no
torchrec model parallelism), so their dense-layout but row-sparse gradients reach the
synchronization schemes through DDP like any other parameter.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from workloads.base import Workload, register_workload
from workloads.common import config_dict, generator
from workloads.criteo import KAGGLE_CARDINALITIES, NUM_DENSE, CriteoLike


@dataclass(frozen=True)
class DLRMPreset:
    max_rows: int | None  # cap on each table (like DLRM's --max-ind-range); None = Kaggle sizes
    embedding_dim: int
    dense_arch: tuple[int, ...]  # bottom MLP; ends with embedding_dim
    over_arch: tuple[int, ...]  # top MLP; ends with 1
    batch_size: int
    lr: float


PRESETS = {
    "tiny": DLRMPreset(max_rows=1_000, embedding_dim=8, dense_arch=(16, 8), over_arch=(16, 1), batch_size=64,
                       lr=0.1),
    "small": DLRMPreset(max_rows=100_000, embedding_dim=16, dense_arch=(64, 16), over_arch=(64, 1),
                        batch_size=1024, lr=0.1),
    # DeepFM's balance on the emulated cluster: 26 tables of at most 30k rows x 64 (74 MB, ~2.3% of the rows
    # per step at batch 1024, the paper's 2.80%), a small MLP: AllReduce ~85% communication at 4 x 1 Gbit/s
    "scaled": DLRMPreset(max_rows=30_000, embedding_dim=64, dense_arch=(64, 64), over_arch=(64, 1), batch_size=1024,
                         lr=0.1),
    # traces at DeepFM's per-GPU density (Table 1: 2.80%) at its batch of 1024: tables of at most 22k rows, narrow
    "table1": DLRMPreset(max_rows=22_000, embedding_dim=8, dense_arch=(8, 8), over_arch=(8, 1), batch_size=1024,
                         lr=0.1),
    # the DLRM reference configuration for Criteo Kaggle, at the paper's batch
    "paper": DLRMPreset(max_rows=None, embedding_dim=16, dense_arch=(512, 256, 64, 16), over_arch=(512, 256, 1),
                        batch_size=1024, lr=0.1),
}


def feature_names(n: int) -> list[str]:
    return [f"cat_{i}" for i in range(n)]


def build_dlrm(cardinalities: tuple[int, ...], cfg: DLRMPreset) -> nn.Module:
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.models.dlrm import DLRM

    names = feature_names(len(cardinalities))
    tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=cfg.embedding_dim, num_embeddings=n,
                                 feature_names=[names[i]])
              for i, n in enumerate(cardinalities)]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
    return DLRM(embedding_bag_collection=ebc, dense_in_features=NUM_DENSE,
                dense_arch_layer_sizes=list(cfg.dense_arch), over_arch_layer_sizes=list(cfg.over_arch))


def dlrm_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Binary cross-entropy of the click logits; one id per table per sample."""
    from torchrec import KeyedJaggedTensor

    sparse = batch["sparse"]
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=feature_names(sparse.shape[1]), values=sparse.t().reshape(-1),
        lengths=torch.ones(sparse.numel(), dtype=torch.int32, device=sparse.device))
    logits = model(batch["dense"], kjt).squeeze(-1)
    return F.binary_cross_entropy_with_logits(logits, batch["labels"])


@register_workload("dlrm")
def build(preset: str, seed: int) -> Workload:
    cfg = PRESETS[preset]
    cards = tuple(min(n, cfg.max_rows or n) for n in KAGGLE_CARDINALITIES)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = build_dlrm(cards, cfg)
    data = CriteoLike(cards, seed)

    def batches(rank: int, world_size: int, data_seed: int) -> Iterator[dict[str, torch.Tensor]]:
        gen = generator(data_seed, rank, world_size, 0xD1)
        while True:
            yield data.sample(cfg.batch_size, gen)

    names = [f"sparse_arch.embedding_bag_collection.embedding_bags.t{i}.weight" for i in range(len(cards))]
    return Workload(
        name="dlrm", preset=preset, model=model, batches=batches, loss=dlrm_loss, sparse_params=names,
        rows=lambda batch: [column.unique() for column in batch["sparse"].t()],  # one id per table and sample
        local_batch_size=cfg.batch_size, lr=cfg.lr,
        info={"config": config_dict(cfg), "cardinalities": list(cards), "embedding_rows": sum(cards),
              "zipf_s": [round(float(s), 4) for s in data.zipf_s],
              "paper": {"density": 0.028, "batch": 1024, "params": 214e6, "model": "DeepFM"}},
    )
