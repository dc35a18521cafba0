"""The functional API: `allreduce` inside a process group, `simulate` over virtual ranks, `sync` of one
scheme object on one communicator. Each runs the one synchronizer (zen.core) on one part."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from zen.comm.base import Communicator
from zen.comm.dist import DistComm, live_group, timeout_seconds
from zen.core import Part, SyncConfig, Synchronizer
from zen.core.build import build, check_nodes, dist_comm, dist_nodes, simulated
from zen.registry import Scheme, scheme_config
from zen.twolevel import NodeComms
from zen.types import SyncStats

_COMMS: dict[tuple, DistComm] = {}
_NODES: dict[tuple, NodeComms] = {}
_SYNCS: dict[tuple, Synchronizer] = {}


def sync(scheme: Scheme, tensor: torch.Tensor, comm: Communicator, out: torch.Tensor | None = None,
         validate: bool = True, divisor: int = 1, *, rows: bool = False, sparse_result: bool = False,
         nonfinite: str = "raise", nodes: NodeComms | None = None, sizes_agreed: bool = False
         ) -> tuple[torch.Tensor, SyncStats]:
    """Run one scheme object on one rank; returns the sum (shaped like `tensor`) and the rank's stats.

    `out` may be `tensor` itself (in place, as DDP's buckets are): sparse schemes then skip zeroing a
    separate output. Where they write only the rows that change, a -0.0 no rank changed stays -0.0.
    `divisor` returns sum / divisor (a DDP hook's mean), divided while the result is written where the
    scheme can, else in one more pass; the same bits either way. `rows` syncs a dense tensor as rows of
    its first dim (an embedding table's gradient: one index per row); `sparse_result` returns a COO
    tensor over the union's rows instead of a dense one (work and memory proportional to those rows).
    `validate` runs the cross-rank input check (one small all-gather); `nonfinite="raise"` makes a NaN or
    Inf a ZenInputError there ("pass": summed like any value, as dense allreduce does). The call's header
    code covers the scheme, its options and these settings, so ranks that differ raise on every rank.
    `nodes` (this rank's sub-groups of `comm`'s ranks, zen.twolevel): two-level sync, the scheme across
    nodes on shards of the node sums; the input check still runs over `comm`. `sizes_agreed`: every rank's tensor
    is known to be alike without the check (a DDP bucket's), so a dense all-reduce sends no sizes first."""
    config = SyncConfig(scheme=scheme_config(scheme), validate=validate, nonfinite=nonfinite, rows=rows,
                        sparse_result=sparse_result, divisor=divisor, sizes_agreed=sizes_agreed,
                        ranks_per_node=nodes.ranks_per_node if nodes else 1, intra=nodes.mode if nodes else "auto")
    return _one(build(config, comm, nodes, instance=scheme), tensor, out)


def _one(syncer: Synchronizer, tensor: torch.Tensor, out: torch.Tensor | None, tag: object = None,
         step: int = 0) -> tuple[torch.Tensor, SyncStats]:
    """One part through `syncer`, waited for; its stats count the input check's bytes too."""
    c = syncer.config
    part = Part(tensor, rows=c.rows, key="tensor", out=out, sparse_result=c.sparse_result)
    call = syncer.run([part], tag=tag, divisor=c.divisor, step=step)
    (outcome,) = call.outcomes
    if outcome.pending is not None:
        outcome.pending.wait()
    return outcome.result, call.stats(0)


def _dist_comm(group: dist.ProcessGroup | None, timeout_s: float | None, device: torch.device) -> DistComm:
    """The communicator of the live process group `group` names for payloads on `device` (a re-created group
    gets a new one; those of destroyed groups are dropped, with the synchronizers made for them)."""
    if timeout_s is not None:
        timeout_seconds(timeout_s)
    for key in [k for k, comm in _COMMS.items() if not comm.alive()]:
        del _COMMS[key]
    for key in [k for k in _SYNCS if k[1] not in _COMMS.values()]:
        del _SYNCS[key]
    for key in [k for k in _NODES if k[0] not in _COMMS.values()]:
        del _NODES[key]
    pg = live_group(group)
    key = (id(pg), timeout_s, str(device))
    comm = _COMMS.get(key)
    if comm is None or not comm.alive() or comm.pg is not pg:
        comm = _COMMS[key] = dist_comm(group, timeout_s, device)
    return comm


def _node_comms(config: SyncConfig, comm: DistComm, group: dist.ProcessGroup | None) -> NodeComms | None:
    """The sub-groups of two-level allreduce, made at the first call with this `ranks_per_node` (every rank
    makes the same calls, so every rank creates them in the same order; every `intra` mode shares them, each
    synchronizer with trials of its own); None for flat."""
    key = (comm, config.ranks_per_node)
    if key not in _NODES:
        nodes = dist_nodes(config, comm, group)
        if nodes is None:
            return None
        _NODES[key] = nodes
    check_nodes(config, comm.world_size, group)
    return replace(_NODES[key], mode=config.intra)


def allreduce(tensor: torch.Tensor, scheme: str = "zen", group: dist.ProcessGroup | None = None, *,
              out: torch.Tensor | None = None, validate: bool = True, timeout_s: float | None = None,
              rows: bool = False, sparse_result: bool = False, tag: int | str | None = None,
              ranks_per_node: int = 1, intra: str = "auto", **options: Any) -> torch.Tensor:
    """SUM of `tensor` over the ranks of `group`, same shape and dtype, on every rank: dense, or with
    `sparse_result` a coalesced COO tensor over the rows any rank has.

    `tensor` may be dense (any shape; `rows`: as rows of its first dim) or sparse COO (e.g.
    nn.Embedding(sparse=True) gradients, duplicates included), on the host or a GPU (the group's backend for
    that device type carries it). Scheme instances (and their per-size state) persist across calls. `tag`
    (e.g. the step and the tensor's name) must match across ranks: a rank that skipped or added a call then
    raises ZenInputError on every rank at its next call, where without a tag its next call would pair with
    the others' previous one. `ranks_per_node` > 1 (the same on every rank, dividing the world size; the
    default group only): two-level sync, dense inside each node of that many consecutive ranks, `scheme`
    across nodes (zen.twolevel; `intra`: its node steps, "auto" (timed at the first calls), "dense" or
    "sparse"). See `sync` for the rest."""
    config = SyncConfig(scheme=scheme, options=options, ranks_per_node=ranks_per_node, intra=intra,
                        validate=validate, rows=rows, sparse_result=sparse_result)
    comm = _dist_comm(group, timeout_s, tensor.device)
    key = (config, comm)
    if key not in _SYNCS:
        _SYNCS[key] = build(config, comm, _node_comms(config, comm, group))
    return _one(_SYNCS[key], tensor, out, tag=tag)[0]


@dataclass
class SimResult:
    outputs: list[torch.Tensor]
    bytes_sent: list[int]
    bytes_received: list[int]
    phases: dict[str, list[int]]  # phase -> bytes received per rank
    phases_sent: dict[str, list[int]]
    stats: list[SyncStats]


def simulate(scheme: str, tensors: Sequence[torch.Tensor], *, warmup: int = 0, seed: int | None = None,
             validate: bool = True, timeout_s: float = 600.0, outs: Sequence[torch.Tensor] | None = None,
             divisor: int = 1, rows: bool = False, sparse_result: bool = False, ranks_per_node: int = 1,
             intra: str = "auto",
             compress: str | None = None, density: float = 0.05, compress_options: dict[str, Any] | None = None,
             **options: Any) -> SimResult:
    """Run `scheme` on len(tensors) virtual ranks in this process, through the same code path as
    torch.distributed; bytes are counted exactly. `warmup` calls run first (e.g. so `zen` has made
    its BP/HC choice) and are not reported. `ranks_per_node` > 1: two-level sync over nodes of that many
    consecutive ranks (sub-groups of the simulated group; phases "intra:..." and "inter:..."; `intra`: the node
    steps, "dense" as the paper's or "sparse" rows, zen.twolevel). `compress`
    (zen.compress) names a compressor of `density`, one per rank, that overwrites each rank's tensor with
    what it sends (every call: warm-up calls feed its residual)."""
    config = SyncConfig(scheme=scheme, options=options, compress=compress, density=density,
                        compress_options=compress_options, compress_rows=True, ranks_per_node=ranks_per_node,
                        intra=intra, validate=validate, rows=rows, sparse_result=sparse_result, divisor=divisor)
    group, syncers = simulated(config, [t.device for t in tensors], timeout_s, seed)

    def rank_main(r: int) -> tuple[torch.Tensor, SyncStats]:
        out = outs[r] if outs is not None else None
        for step in range(warmup + 1):
            result = _one(syncers[r], tensors[r], out, step=step)
        return result

    results = group.run(rank_main)
    stats = [s for _, s in results]
    phases = sorted({p for s in stats for p in (*s.traffic.received, *s.traffic.sent)})
    return SimResult(
        outputs=[o for o, _ in results],
        bytes_sent=[s.traffic.bytes_sent for s in stats],
        bytes_received=[s.traffic.bytes_received for s in stats],
        phases={p: [s.traffic.received.get(p, 0) for s in stats] for p in phases},
        phases_sent={p: [s.traffic.sent.get(p, 0) for s in stats] for p in phases},
        stats=stats,
    )
