"""The one seam every synchronization passes through: `zen.allreduce`, `zen.simulate`, `zen.sync` and the DDP
hook all run `Synchronizer.run` on a list of `Part`s, with a synchronizer built by `zen.core.build`.

A call, in order: begin it on the communicator (its number and its configuration's code go into every
header), plan each part (which scheme runs it, zen.route), prepare it (a compressor's choice, or the tensor as
rows, non-zero rows extracted once), check every part across ranks in one small all-gather (when the
configuration says it is due), then synchronize each part: through its route (embedding rows, a compressed
part, a sparse COO gradient, a whole tensor), or a dense all-reduce that completes later (`Pending`: DDP's
other parameters, so they do not hold a lane up). The route is the configured scheme, flat (`Flat`), or
wrapped: in two-level sync for embedding rows (`zen.twolevel.TwoLevel`), or in the compressor's step
(`zen.compress.base.Compressed`; a quantizer's `Quantized` exchanges its codes instead of running it).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import torch

from zen.comm.base import Communicator, Pending
from zen.comm.pool import MAX_BYTES
from zen.compress import Compressor
from zen.compress.base import compress_part
from zen.core.config import SyncConfig
from zen.device import accelerated
from zen.grad import LocalGrad, to_local_grad
from zen.output import Output, make_output
from zen.registry import Scheme, make_scheme
from zen.route import Flat, PartContext, sends_rows
from zen.twolevel import NodeComms, TwoLevel
from zen.types import SyncStats, ZenInputError
from zen.validate import check_parts

DENSE = "allreduce"  # the scheme of every part that is not the configured scheme's
# the most a call may reserve for receives bounded by the tensor's rows: what the pool keeps (a receive buffer it
# cannot keep is allocated every call, and the pages a message touches fault in every time, more than the header
# round saved)
ROW_BOUND_BYTES = MAX_BYTES // 2


@dataclass(frozen=True)
class Part:
    """One tensor of a call. `rows`: synchronized as rows of its first dim (an embedding table: one index
    per row); `sparse`: natural sparsity, the configured scheme's (else one of DDP's other parameters,
    dense); `key` names it on this rank (its scheme instance, its compressor memory); `tag` is the same on
    every rank (seeds of choices that must agree); `out`: where the result goes (None: a new tensor);
    `sparse_result`: the result as a COO tensor over the union's rows."""

    tensor: torch.Tensor
    rows: bool = False
    sparse: bool = True
    key: Hashable = ()
    tag: int = 0
    out: torch.Tensor | None = None
    sparse_result: bool = False

    @property
    def coo(self) -> bool:
        return self.tensor.layout == torch.sparse_coo


@dataclass
class Outcome:
    """What a part's synchronization gave: its result (for a `pending` dense part, the tensor the sum will be
    in once it is waited for) and this rank's stats."""

    result: torch.Tensor
    stats: SyncStats
    sparse: bool
    pending: Pending | None = None


@dataclass
class Call:
    """What one `Synchronizer.run` gave: an outcome per part, and the input check's stats where it ran (its
    bytes, phase `meta`, are the call's, not one part's)."""

    outcomes: list[Outcome]
    check: SyncStats | None = None

    def stats(self, i: int = 0) -> SyncStats:
        """Part i's stats with the check's bytes counted in them first (the functional API's one part)."""
        stats = self.outcomes[i].stats
        if self.check is not None:
            self.check.traffic.absorb(stats.traffic)
            stats.traffic = self.check.traffic
            self.check = None
        return stats


@dataclass
class Plan:
    """How one part travels: `route` (None: the dense all-reduce, asynchronous), whether the compressor
    takes it, and the rows view its route gets."""

    route: Flat | None
    compressed: bool
    rows: bool


@dataclass
class Synchronizer:
    """One rank's configured synchronization over `comm` (and, two-level, its `nodes`): scheme instances per
    part key (a scheme's per-size state is about one tensor) and the compressor with its residuals (the hook
    shares one across its lanes). `instance` fixes the scheme object (the functional `zen.sync`). `on_issue`
    learns of every asynchronous all-reduce as it is issued, so a caller can keep it in sight even when a
    later part of the same call fails (the hook must not exit with one in flight). Built by zen.core.build."""

    config: SyncConfig
    comm: Communicator
    nodes: NodeComms | None = None
    instance: Scheme | None = None
    compressor: Compressor | None = None
    on_issue: Callable[[Pending], object] | None = None
    _schemes: dict[tuple[str, Hashable], Scheme] = field(default_factory=dict, init=False)

    @property
    def sparse_input(self) -> bool:
        """Whether the configured scheme sends rows (a dense scheme takes parts as dense all-reduces)."""
        return sends_rows(self.scheme_for("", ()))

    def scheme_for(self, name: str, key: Hashable) -> Scheme:
        """The instance of the configured scheme (`name` ""), or of `name`, for the part `key`."""
        if self.instance is not None and not name:
            return self.instance
        if (name, key) not in self._schemes:
            options = dict(self.config.options) if not name else {}
            self._schemes[name, key] = make_scheme(name or self.config.scheme, **options)
        return self._schemes[name, key]

    def plan(self, part: Part) -> Plan:
        """The route of a part: compressed when a compressor is set and the part is dense (the scheme's own
        parts only with `compress_rows`); a quantizer brings its own exchange; the scheme takes COO gradients,
        embedding rows and compressed parts (two-level around it for embedding rows), unless it is dense: then
        a part synchronized in place is an asynchronous all-reduce (as DDP's other parameters are)."""
        c, compressor = self.config, self.compressor
        if self.nodes is not None and not c.flat_fallback:
            _refuse_two_level(part, compressor)
        compressed = compressor is not None and not part.coo and (not part.sparse or c.compress_rows)
        if compressed and compressor is not None and compressor.own_exchange:
            return Plan(compressor.wrap(self.scheme_for("", part.key)), True, False)
        in_place = part.out is part.tensor
        through = part.coo or not in_place or ((part.sparse or compressed) and self.sparse_input)
        if not through:
            return Plan(None, compressed, False)
        scheme = self.scheme_for("", part.key)
        if compressed and compressor is not None:
            return Plan(compressor.wrap(scheme), True, False)
        if self.nodes is not None and not part.coo:
            return Plan(TwoLevel(scheme, self.nodes), False, part.rows)
        return Plan(Flat(scheme), False, part.rows and not part.coo)

    def run(self, parts: Sequence[Part], *, tag: object = None, divisor: int = 1, step: int = 0) -> Call:
        """One call over `parts`: see the module docstring. `tag` names the call in its headers (the same on
        every rank); `divisor` divides every result (a DDP mean); `step` counts optimizer steps (the checks'
        schedule, compressors' schedules)."""
        comm, c = self.comm, self.config
        check = c.check_due(step)
        code = c.code(tag)
        comm.begin_call(code, sizes_agreed=check or c.sizes_agreed)
        if self.nodes is not None:
            self.nodes.begin_call(code, sizes_agreed=True)
        stats = [SyncStats() for _ in parts]
        checked = SyncStats() if check else None
        try:  # everything a rank can refuse locally, before the check (so the others learn it there)
            plans = [self.plan(p) for p in parts]
            grads = [self._prepare(p, plan, step) for p, plan in zip(parts, plans, strict=True)]
            outputs = [make_output(p.tensor, g, p.out, divisor, p.sparse_result) if plan.route is not None else None
                       for p, plan, g in zip(parts, plans, grads, strict=True)]
        except ZenInputError as local:
            if checked is not None and comm.world_size > 1:
                comm.traffic = checked.traffic
                _share_failure(local, comm, c)
            raise
        if checked is not None:
            comm.traffic = checked.traffic
            described = [(g, tuple(p.tensor.shape), plan.route.name if plan.route is not None else DENSE)
                         for g, p, plan in zip(grads, parts, plans, strict=True)]
            for grad, rows in zip(grads, check_parts(described, comm, c.nonfinite), strict=True):
                if rows is not None:
                    comm.announce(grad, rows)
        elif comm.sizes_agreed and comm.short_receives and comm.world_size > 1:  # no counts: M bounds them
            for grad, plan in zip(grads, plans, strict=True):
                if plan.route is not None and plan.route.bounded_by_rows and (
                        bound := row_bound(grad, comm.world_size)) is not None:
                    comm.announce(grad, bound)
        return Call([self._sync(p, plan, grad, output, s, divisor)
                     for p, plan, grad, output, s in zip(parts, plans, grads, outputs, stats, strict=True)], checked)

    def _prepare(self, part: Part, plan: Plan, step: int) -> LocalGrad:
        """The part as this rank's rows, as its route makes them; a part for the dense all-reduce as it is (or
        the compressor's choice, which overwrites it)."""
        ctx = PartContext(part.key, part.tag, step, self.comm.world_size)
        if plan.route is not None:
            return plan.route.prepare(part.tensor, plan.rows, ctx, self.comm)
        if plan.compressed and self.compressor is not None:
            return compress_part(self.compressor, part.tensor, ctx)
        return to_local_grad(part.tensor, plan.rows)

    def _sync(self, part: Part, plan: Plan, grad: LocalGrad, output: Output | None, stats: SyncStats,
              divisor: int) -> Outcome:
        comm = self.comm
        comm.traffic = stats.traffic
        if plan.compressed and self.compressor is not None:  # what it keeps for later, measured
            stats.extra["residual_norm"] = self.compressor.residual_norm(part.key, lazy=accelerated(grad.device))
        if plan.route is None:
            pending = comm.all_reduce_async(part.tensor, phase=DENSE)
            if divisor != 1:
                pending = pending.then(lambda t: t.div_(divisor))
            if self.on_issue is not None:
                self.on_issue(pending)
            return Outcome(part.tensor, stats, part.sparse, pending)
        assert output is not None
        plan.route(grad, comm, output, stats)
        return Outcome(output.finish(), stats, part.sparse)


def row_bound(grad: LocalGrad, world_size: int) -> list[int] | None:
    """Every rank's rows bounded by M, the tensor's: what a call whose ranks' tensors are known alike (DDP's
    buckets) but that ran no input check announces, so that its exchanges still take one round where the backend
    takes short receives (a header round each costs more than the rest of a small exchange). Receives are then
    posted for M rows a peer and filled only as far as the message goes; None where receives of M rows from every
    peer would take more than ROW_BOUND_BYTES."""
    row_bytes = grad.index_dtype().itemsize + grad.row_width * grad.dtype.itemsize
    if grad.num_rows * row_bytes * (world_size - 1) > ROW_BOUND_BYTES:
        return None
    return [grad.num_rows] * world_size


def _refuse_two_level(part: Part, compressor: Compressor | None) -> None:
    """What two-level sync cannot take, where nothing may go flat instead (the functional API)."""
    TwoLevel.refuse(part.tensor, part.sparse_result)
    if compressor is not None:
        raise ZenInputError("a compressor with two-level sync is not supported; sync flat")


def _share_failure(local: ZenInputError, comm: Communicator, config: SyncConfig) -> None:
    """Join the cross-rank check as a rank that failed locally, so the others raise too; then this rank
    raises its own error (chained to what the check said)."""
    try:
        check_parts(None, comm, config.nonfinite)
    except ZenInputError as shared:
        raise local from shared
