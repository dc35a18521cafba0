"""Traffic predicted from the ranks' actual non-zero row sets, scheme by scheme.

Each scheme's `predict(sets, layout)` returns what every rank will receive per phase; this module adds
the input-validation metadata that the synchronizer (zen.core) exchanges for every scheme, and derives the sets and the
wire layout from the tensors a simulation will use, so tests can hold measured bytes against it.
"""

from __future__ import annotations

from typing import Any

import torch

from zen.comm.base import gather_meta
from zen.grad import to_local_grad
from zen.registry import make_scheme
from zen.twolevel import INTER, INTRA, predict_two_level
from zen.types import PhaseBytes, WireLayout


def validation_meta(world_size: int) -> int:
    return gather_meta(world_size)


def layout_and_sets(tensors: list[torch.Tensor], seed: int = 0) -> tuple[WireLayout, list[torch.Tensor]]:
    """Non-zero row sets (sorted int64) and wire sizes of the tensors a scheme would be given."""
    grads = [to_local_grad(t) for t in tensors]
    g = grads[0]
    layout = WireLayout(world_size=len(tensors), rows=g.num_rows, width=g.row_width,
                        value_bytes=g.dtype.itemsize, index_bytes=g.index_dtype().itemsize, seed=seed)
    return layout, [gr.rows()[0] for gr in grads]


def predict(scheme: str, sets: list[torch.Tensor], layout: WireLayout, ranks_per_node: int = 1,
            intra: str = "auto", **options: Any) -> list[PhaseBytes]:
    """Bytes each rank receives per phase in one steady-state call (after any warm-up); `ranks_per_node` > 1:
    of two-level sync (`two_level`, its node steps `intra`)."""
    made = make_scheme(scheme, **options)
    per_rank = predict_two_level(made, sets, layout, ranks_per_node, intra) if ranks_per_node > 1 else \
        made.predict(sets, layout)
    meta = validation_meta(layout.world_size)
    for phases in per_rank:
        if meta:
            phases["meta"] = phases.get("meta", 0) + meta
    return per_rank


def totals(per_rank: list[PhaseBytes]) -> list[int]:
    return [sum(p.values()) for p in per_rank]


def link_class(phase: str) -> str:
    """"intra" (a node's local link), "inter" (its uplink) or "world" (all ranks: the input check)."""
    for prefix in (INTRA, INTER):
        if phase.startswith(prefix):
            return prefix.rstrip(":")
    return "world"


def uplink_bytes(per_rank: list[PhaseBytes], ranks_per_node: int) -> list[int]:
    """Per node of `ranks_per_node` consecutive ranks, what its uplink carries of the ranks' per-phase bytes:
    all but the node's own ("intra") phases (for k = 1 simply each rank's total)."""
    outside = [sum(v for p, v in phases.items() if link_class(p) != "intra") for phases in per_rank]
    return [sum(outside[n : n + ranks_per_node]) for n in range(0, len(outside), ranks_per_node)]
