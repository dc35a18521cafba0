"""Traffic predicted from the ranks' actual non-zero row sets, scheme by scheme.

Each scheme's `predict(sets, layout)` returns what every rank will receive per phase; this module adds
the input-validation metadata that `zen.sync` exchanges for every scheme, and derives the sets and the
wire layout from the tensors a simulation will use, so tests can hold measured bytes against it.
"""

from __future__ import annotations

from typing import Any

import torch

from zen.comm.base import COUNT_BYTES, FIXED_SLOTS, HEAD_BYTES
from zen.grad import to_local_grad
from zen.registry import make_scheme
from zen.types import PhaseBytes, WireLayout

FIXED_BYTES = 8 * FIXED_SLOTS  # one rank's part of a fixed all-gather (zen.comm.base)


def message_meta(tensors_per_message: int) -> int:
    """Metadata of one message received from one peer: its header and its tensors' row counts."""
    return HEAD_BYTES + tensors_per_message * COUNT_BYTES


def count_meta(world_size: int, tensors_per_message: int) -> int:
    """Metadata received in an all_to_all_v of `tensors_per_message` tensors (one message per peer)."""
    return (world_size - 1) * message_meta(tensors_per_message)


def gather_meta(world_size: int) -> int:
    """What one fixed all-gather brings (the input check, a scheme's small agreement)."""
    return (world_size - 1) * FIXED_BYTES


def gather_v_meta(world_size: int, tensors_per_message: int) -> int:
    """Metadata received in an all_gather_v: its fixed all-gather of sizes, then each peer's row counts."""
    return (world_size - 1) * (FIXED_BYTES + tensors_per_message * COUNT_BYTES)


def validation_meta(world_size: int) -> int:
    return gather_meta(world_size)


def layout_and_sets(tensors: list[torch.Tensor], seed: int = 0) -> tuple[WireLayout, list[torch.Tensor]]:
    """Non-zero row sets (sorted int64) and wire sizes of the tensors a scheme would be given."""
    grads = [to_local_grad(t) for t in tensors]
    g = grads[0]
    layout = WireLayout(world_size=len(tensors), rows=g.num_rows, width=g.row_width,
                        value_bytes=g.dtype.itemsize, index_bytes=g.index_dtype().itemsize, seed=seed)
    return layout, [gr.rows()[0] for gr in grads]


def predict(scheme: str, sets: list[torch.Tensor], layout: WireLayout, **options: Any) -> list[PhaseBytes]:
    """Bytes each rank receives per phase in one steady-state call (after any warm-up)."""
    per_rank = make_scheme(scheme, **options).predict(sets, layout)
    meta = validation_meta(layout.world_size)
    for phases in per_rank:
        if meta:
            phases["meta"] = phases.get("meta", 0) + meta
    return per_rank


def totals(per_rank: list[PhaseBytes]) -> list[int]:
    return [sum(p.values()) for p in per_rank]
