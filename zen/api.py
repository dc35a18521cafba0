"""The functional API: `allreduce` inside a process group, `simulate` over virtual ranks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from zen.comm.base import Communicator, code_of
from zen.comm.dist import DistComm, live_group, timeout_seconds
from zen.comm.sim import SimComm, SimGroup
from zen.compress import Compressor, PartContext, make_compressor
from zen.grad import LocalGrad, to_local_grad
from zen.output import DenseOutput, Output, make_output
from zen.registry import Scheme, make_scheme, scheme_config
from zen.twolevel import NodeComms, dist_node_comms, nodes_of, refuse_sparse, sim_node_comms, two_level
from zen.types import SyncStats, ZenInputError
from zen.validate import check_inputs

_COMMS: dict[tuple, DistComm] = {}
_NODES: dict[tuple, NodeComms] = {}
_SCHEMES: dict[tuple, Scheme] = {}


def sync(scheme: Scheme, tensor: torch.Tensor, comm: Communicator, out: torch.Tensor | None = None,
         validate: bool = True, divisor: int = 1, *, rows: bool = False, sparse_result: bool = False,
         check_finite: bool = True, compressor: Compressor | None = None, ctx: PartContext | None = None,
         nodes: NodeComms | None = None) -> tuple[torch.Tensor, SyncStats]:
    """Run one scheme on one rank; returns the sum (shaped like `tensor`) and the rank's stats.

    `out` may be `tensor` itself (in place, as DDP's buckets are): sparse schemes then skip zeroing a
    separate output. Where they write only the rows that change, a -0.0 no rank changed stays -0.0.
    `divisor` returns sum / divisor (a DDP hook's mean), divided while the result is written where the
    scheme can, else in one more pass; the same bits either way. `rows` syncs a dense tensor as rows of
    its first dim (an embedding table's gradient: one index per row); `sparse_result` returns a COO
    tensor over the union's rows instead of a dense one (work and memory proportional to those rows).
    `validate` runs the cross-rank input check (one small all-gather); `check_finite` makes a NaN or Inf
    a ZenInputError there (else it is summed like any value, as dense allreduce does). The call's header
    code covers the scheme, its options and these settings, so ranks that differ raise on every rank.
    `compressor` (zen.compress) first overwrites `tensor` with what it chooses to send (its residual keeps
    the rest, under `ctx.key`); the result is the sum of the ranks' compressed tensors. `nodes` (this rank's
    sub-groups of `comm`'s ranks, zen.twolevel): two-level sync, the scheme across nodes on shards of the
    node sums; the input check still runs over `comm` (not with a compressor)."""
    return _sync(lambda: scheme, scheme_config(scheme), tensor, comm, out, validate, divisor, rows, sparse_result,
                 check_finite, compressor, ctx, nodes)


def _sync(make: Callable[[], Scheme], config: str, tensor: torch.Tensor, comm: Communicator,
          out: torch.Tensor | None, validate: bool, divisor: int, rows: bool, sparse_result: bool,
          check_finite: bool, compressor: Compressor | None = None, ctx: PartContext | None = None,
          nodes: NodeComms | None = None) -> tuple[torch.Tensor, SyncStats]:
    """`sync` of the scheme `make` returns (`config`: its name and options). If making it fails on one
    rank (an unknown scheme) or its input or `out=` is refused, that rank still joins the check, so every
    rank raises ZenInputError instead of the others timing out."""
    if compressor is not None:
        config = f"{config}|compress={compressor.config}"
    code = code_of(f"{config}|validate={validate}|finite={check_finite}|rows={rows}|sparse={sparse_result}|"
                   f"divisor={divisor}" + (f"|ranks_per_node={nodes.ranks_per_node}|{nodes.mode}" if nodes else ""))
    comm.begin_call(code, sizes_agreed=validate)
    if nodes is not None:
        nodes.begin_call(code, sizes_agreed=validate)
    stats = SyncStats()
    comm.traffic = stats.traffic
    try:
        scheme = make()
        if nodes is not None:
            refuse_sparse(tensor, sparse_result)
            if compressor is not None:
                raise ZenInputError("a compressor with two-level sync is not supported; sync flat")
        grad = prepare(scheme, tensor, rows, extract=nodes is None or nodes.mode == "sparse", compressor=compressor,
                       ctx=ctx)
        output = make_output(tensor, grad, out, divisor, sparse_result)
    except ZenInputError as local:
        if validate and comm.world_size > 1:
            _share_failure(local, tensor, config, comm)
        raise
    if validate:
        check_inputs(grad, tuple(tensor.shape), config, comm, check_finite)
    if compressor is not None and compressor.own_exchange:
        assert ctx is not None and isinstance(output, DenseOutput)
        compressor.exchange(tensor, ctx, comm, output.result, divisor)
        return output.result, stats
    return _exchange(scheme, grad, comm, output, stats, nodes)


def _share_failure(local: ZenInputError, tensor: torch.Tensor, config: str, comm: Communicator) -> None:
    """Join the cross-rank check as a rank that failed locally, so the others raise too; then this rank
    raises its own error (chained to what the check said)."""
    try:
        check_inputs(None, tuple(tensor.shape), config, comm, failed=True)
    except ZenInputError as shared:
        raise local from shared


def prepare(scheme: Scheme, tensor: torch.Tensor, rows: bool = False, extract: bool = True,
            compressor: Compressor | None = None, ctx: PartContext | None = None) -> LocalGrad:
    """`tensor` as this rank's rows, the non-zero ones extracted (once) if the scheme sends rows and
    `extract` (two-level sync with dense node steps extracts them from its shard of the node sum instead;
    sparse node steps send the rank's own rows, so it extracts them here). A sparsifier overwrites `tensor`
    with its choice and hands its rows over as they are (a quantizer compresses in its own exchange: the
    input is checked as it is, and no scheme reads its rows)."""
    if compressor is not None:
        if ctx is None or tensor.layout != torch.strided:
            raise ZenInputError("a compressor needs a dense tensor and a PartContext (ctx=)")
        if not compressor.own_exchange:
            return compressor.compress(tensor, ctx)
    grad = to_local_grad(tensor, rows)
    if extract and compressor is None and getattr(scheme, "sparse_input", True):
        grad.rows()
    return grad


def run(scheme: Scheme, tensor: torch.Tensor, grad: LocalGrad, comm: Communicator,
        out: torch.Tensor | None = None, divisor: int = 1, sparse_result: bool = False,
        stats: SyncStats | None = None, nodes: NodeComms | None = None) -> tuple[torch.Tensor, SyncStats]:
    """The scheme's exchange of `grad` (from `prepare(tensor)`, checked or not); see `sync`. Bytes are
    added to `stats` (a new one if None)."""
    stats = stats or SyncStats()
    comm.traffic = stats.traffic
    return _exchange(scheme, grad, comm, make_output(tensor, grad, out, divisor, sparse_result), stats, nodes)


def _exchange(scheme: Scheme, grad: LocalGrad, comm: Communicator, output: Output, stats: SyncStats,
              nodes: NodeComms | None = None) -> tuple[torch.Tensor, SyncStats]:
    if nodes is None:
        scheme(grad, comm, output, stats)
    else:
        assert isinstance(output, DenseOutput)
        two_level(scheme, grad, nodes, output, stats)
    return output.finish(), stats


def _dist_comm(group: dist.ProcessGroup | None, timeout_s: float | None) -> DistComm:
    """The communicator of the live process group `group` names (a re-created group gets a new one; those of
    destroyed groups are dropped, with the scheme instances made for them)."""
    if timeout_s is not None:
        timeout_seconds(timeout_s)
    for key in [k for k, comm in _COMMS.items() if not comm.alive()]:
        del _COMMS[key]
    for key in [k for k in _SCHEMES if k[1] not in _COMMS.values()]:
        del _SCHEMES[key]
    for key in [k for k in _NODES if k[0] not in _COMMS.values()]:
        del _NODES[key]
    pg = live_group(group)
    key = (id(pg), timeout_s)
    comm = _COMMS.get(key)
    if comm is None or not comm.alive() or comm.pg is not pg:
        comm = _COMMS[key] = DistComm(group, timeout_s=timeout_s)
    return comm


def _node_comms(comm: DistComm, group: dist.ProcessGroup | None, ranks_per_node: int,
                timeout_s: float | None, intra: str = "dense") -> NodeComms | None:
    """The sub-groups of two-level allreduce, made at the first call with this `ranks_per_node` (every rank
    makes the same calls, so every rank creates them in the same order; both `intra` modes share them);
    None for flat (1)."""
    nodes_of(comm.world_size, ranks_per_node)
    if ranks_per_node == 1:
        return None
    if group is not None:
        raise ZenInputError("zen: ranks_per_node > 1 needs the default group: its node groups are made of all ranks")
    key = (comm, ranks_per_node)
    if key not in _NODES:
        _NODES[key] = dist_node_comms(ranks_per_node, timeout_s)
    return replace(_NODES[key], mode=intra)


def _cached_scheme(name: str, comm: DistComm, options: dict[str, Any], layout: tuple[int, str] = (1, "dense")
                   ) -> Scheme:
    """One instance per communicator and layout (ranks per node, node steps): a two-level instance's
    per-size state is about shards."""
    key = (name, comm, tuple(sorted(options.items())), layout)
    if key not in _SCHEMES:
        _SCHEMES[key] = make_scheme(name, **options)
    return _SCHEMES[key]


def allreduce(tensor: torch.Tensor, scheme: str = "zen", group: dist.ProcessGroup | None = None, *,
              out: torch.Tensor | None = None, validate: bool = True, timeout_s: float | None = None,
              rows: bool = False, sparse_result: bool = False, tag: int | str | None = None,
              ranks_per_node: int = 1, intra: str = "dense", **options: Any) -> torch.Tensor:
    """SUM of `tensor` over the ranks of `group`, same shape and dtype, on every rank: dense, or with
    `sparse_result` a coalesced COO tensor over the rows any rank has.

    `tensor` may be dense (any shape; `rows`: as rows of its first dim) or sparse COO (e.g.
    nn.Embedding(sparse=True) gradients, duplicates included). Scheme instances (and their per-size
    state) persist across calls. `tag` (e.g. the step and the tensor's name) must match across ranks: a rank
    that skipped or added a call then raises ZenInputError on every rank at its next call, where without a
    tag its next call would pair with the others' previous one. `ranks_per_node` > 1 (the same on every
    rank, dividing the world size; the default group only): two-level sync, dense inside each node of that
    many consecutive ranks, `scheme` across nodes (zen.twolevel; `intra`: its node steps, "dense" or "sparse").
    See `sync` for the rest."""
    comm = _dist_comm(group, timeout_s)
    nodes = _node_comms(comm, group, ranks_per_node, timeout_s, intra)
    return _sync(lambda: _cached_scheme(scheme, comm, options, (ranks_per_node, intra)),
                 f"{scheme_config(scheme, options)}|tag={tag}", tensor, comm, out, validate, 1, rows, sparse_result,
                 True, nodes=nodes)[0]


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
             intra: str = "dense",
             compress: str | None = None, density: float = 0.05, compress_options: dict[str, Any] | None = None,
             **options: Any) -> SimResult:
    """Run `scheme` on len(tensors) virtual ranks in this process, through the same code path as
    torch.distributed; bytes are counted exactly. `warmup` calls run first (e.g. so `zen` has made
    its BP/HC choice) and are not reported. `ranks_per_node` > 1: two-level sync over nodes of that many
    consecutive ranks (sub-groups of the simulated group; phases "intra:..." and "inter:..."; `intra`: the node
    steps, "dense" as the paper's or "sparse" rows, zen.twolevel). `compress`
    (zen.compress) names a compressor of `density`, one per rank, that overwrites each rank's tensor with
    what it sends (every call: warm-up calls feed its residual)."""
    P = len(tensors)
    nodes_of(P, ranks_per_node)
    group = SimGroup(P, timeout_s=timeout_s, seed=seed)
    node_comms = sim_node_comms(group, ranks_per_node, intra) if ranks_per_node > 1 else None
    instances = [make_scheme(scheme, **options) for _ in range(P)]
    squeezers = [make_compressor(compress, density, **(compress_options or {})) if compress else None
                 for _ in range(P)]

    def rank_main(r: int) -> tuple[torch.Tensor, SyncStats]:
        comm = SimComm(group, r, tensors[r].device)
        nodes = node_comms(r, tensors[r].device) if node_comms else None
        out = outs[r] if outs is not None else None
        for step in range(warmup + 1):
            result = sync(instances[r], tensors[r], comm, out, validate, divisor, rows=rows,
                          sparse_result=sparse_result, compressor=squeezers[r],
                          ctx=PartContext("tensor", 0, step, P), nodes=nodes)
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
