"""Traffic predicted from the ranks' actual non-zero row sets, scheme by scheme.

Each scheme's `predict(sets, layout)` returns what every rank will receive per phase; this module adds
the input-validation metadata that `zen.sync` exchanges for every scheme, and derives the sets and the
wire layout from the tensors a simulation will use, so tests can hold measured bytes against it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from zen.comm.base import COUNT_BYTES, FIXED_SLOTS, HEAD_BYTES
from zen.grad import to_local_grad
from zen.registry import Scheme, make_scheme
from zen.twolevel import INTER, INTRA, interleave, interleaved_rows, nodes_of, shard_bounds
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


def predict(scheme: str, sets: list[torch.Tensor], layout: WireLayout, ranks_per_node: int = 1,
            intra: str = "dense", **options: Any) -> list[PhaseBytes]:
    """Bytes each rank receives per phase in one steady-state call (after any warm-up); `ranks_per_node` > 1:
    of two-level sync (`two_level`, its node steps `intra`)."""
    made = make_scheme(scheme, **options)
    per_rank = two_level(made, sets, layout, ranks_per_node, intra) if ranks_per_node > 1 else \
        made.predict(sets, layout)
    meta = validation_meta(layout.world_size)
    for phases in per_rank:
        if meta:
            phases["meta"] = phases.get("meta", 0) + meta
    return per_rank


def totals(per_rank: list[PhaseBytes]) -> list[int]:
    return [sum(p.values()) for p in per_rank]


def two_level(scheme: Scheme, sets: list[torch.Tensor], layout: WireLayout, ranks_per_node: int,
              intra: str = "dense") -> list[PhaseBytes]:
    """Per rank, per phase, the bytes of zen.twolevel (input check aside). Inside the node, dense (contiguous
    shards): the reduce-scatter brings k - 1 copies of the rank's shard, the all-gather the other shards,
    (k-1)/k of the tensor each when k divides it; sparse (interleaved shards): the other ranks' non-zero rows
    of the rank's shard, and every other shard's rows of the result (the union of all ranks' sets there), as
    COO rows. Across nodes: `scheme.predict` on each shard, over the nodes' sets there, the union of their
    ranks' sets (exact unless values cancel to zero)."""
    k, P = ranks_per_node, layout.world_size
    nodes = nodes_of(P, k)
    got: list[PhaseBytes] = [{} for _ in range(P)]
    union = int(torch.unique(torch.cat(sets)).numel()) if intra == "sparse" else 0
    for j in range(k):
        local, rows = _shard(sets, layout.rows, k, j, intra)
        elsewhere = union - int(torch.unique(torch.cat(local)).numel()) if intra == "sparse" else 0
        node_sets = [torch.unique(torch.cat(local[n * k : (n + 1) * k])) for n in range(nodes)]
        shard = replace(layout, world_size=nodes, rows=rows, index_bytes=4 if rows < 2**31 else 8)
        across = scheme.predict(node_sets, shard) if rows else [{} for _ in range(nodes)]
        for n in range(nodes):
            phases = got[n * k + j]
            phases.update({INTER + p: v for p, v in across[n].items()})
            phases.update(_intra_dense(layout, rows, k) if intra == "dense" else
                          _intra_sparse(layout, local, elsewhere, n, j, k))
    return got


def _shard(sets: list[torch.Tensor], rows: int, k: int, j: int, intra: str) -> tuple[list[torch.Tensor], int]:
    """Every rank's set within shard j (ids local to the shard) and the shard's rows: contiguous blocks for
    dense node steps, interleaved rows (r % k == j, as r // k) for sparse ones."""
    if intra == "dense":
        bounds = shard_bounds(rows, k)
        lo, hi = bounds[j], bounds[j + 1]
        return [s[(s >= lo) & (s < hi)] - lo for s in sets], hi - lo
    shard = []
    for s in sets:
        owner, ids = interleave(s, k)
        shard.append(ids[owner == j])
    return shard, interleaved_rows(rows, k, j)


def _intra_dense(layout: WireLayout, rows: int, k: int) -> PhaseBytes:
    row_bytes = layout.width * layout.value_bytes
    return {INTRA + "reduce_scatter": (k - 1) * rows * row_bytes,
            INTRA + "all_gather": (layout.rows - rows) * row_bytes,
            INTRA + "meta": count_meta(k, 1) + gather_v_meta(k, 1)}


def _intra_sparse(layout: WireLayout, local: list[torch.Tensor], elsewhere: int, n: int, j: int, k: int
                  ) -> PhaseBytes:
    """Local rank j of node n: its node peers' rows in shard j (`local`: every rank's set there), and the
    result's rows in every other shard (`elsewhere`: the union of all ranks' sets outside shard j)."""
    row = 4 + layout.width * layout.value_bytes  # int32 id within the shard, then the row
    pushed = sum(int(local[n * k + i].numel()) for i in range(k) if i != j)
    return {INTRA + "reduce_scatter": pushed * row, INTRA + "all_gather": elsewhere * row,
            INTRA + "meta": count_meta(k, 2) + gather_v_meta(k, 2)}


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
