"""What every workload provides: a model, per-rank batches, a loss, and which parameters are the
sparse (embedding) ones whose gradients go through the chosen scheme."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from zen.plugins import Registry

PRESETS = ("tiny", "small", "scaled", "paper", "table1")


@dataclass
class Workload:
    name: str
    preset: str
    model: nn.Module
    # batches(rank, world_size, seed) -> endless iterator of this rank's batches (different per rank)
    batches: Callable[[int, int, int], Iterator[Any]]
    # loss(model, batch) -> scalar tensor
    loss: Callable[[nn.Module, Any], torch.Tensor]
    # names (model.named_parameters()) of embedding parameters whose gradients are naturally sparse
    sparse_params: list[str]
    local_batch_size: int
    lr: float = 0.1
    info: dict[str, Any] = field(default_factory=dict)
    # rows(batch) -> per sparse parameter, the distinct rows the batch looks up: exactly its gradient's
    # non-zero rows, without running the model (`zen profile --rows-from ids`: traces at 128 workers)
    rows: Callable[[Any], list[torch.Tensor]] | None = None


WORKLOADS: Registry[Workload] = Registry("workload", ("workloads.models",))  # builders (preset, seed) -> Workload
register_workload = WORKLOADS.register


def workload_names() -> list[str]:
    return WORKLOADS.names()


def builtin_workloads() -> list[str]:
    """The workloads this package's own modules register (a plugin module, e.g. `zen train --plugin`, or a
    test may register more): what the tests run every workload test on."""
    return [n for n in workload_names() if WORKLOADS.get(n).__module__.startswith(f"{__package__}.")]


def reads_text(name: str) -> bool:
    """Whether a workload's builder takes `corpora`: the text it trains on in place of its preset's."""
    return "corpora" in inspect.signature(WORKLOADS.get(name)).parameters


def build_workload(name: str, preset: str = "tiny", seed: int = 0,
                   corpora: tuple[str, ...] | None = None) -> Workload:
    """Build a registered workload; unknown names and presets raise ValueError listing the choices. `corpora`
    (workloads/corpora.py) replaces a text workload's preset corpora."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of: {', '.join(PRESETS)}")
    if corpora is None:
        return WORKLOADS.make(name, preset=preset, seed=seed)
    if not reads_text(name):
        raise ValueError(f"workload {name!r} reads no text corpora")
    return WORKLOADS.make(name, preset=preset, seed=seed, corpora=corpora)
