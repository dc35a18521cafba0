"""The one seam every synchronization passes through: `zen.allreduce`, `zen.simulate` and the DDP hook all
run `Synchronizer.run` on a list of `Part`s.

A call, in order: begin it on the communicator (its number and its configuration's code go into every
header), prepare each part (a compressor's choice, or the tensor as rows, non-zero rows extracted once),
check every part across ranks in one small all-gather (when due), then synchronize each part: through the
scheme (embedding rows, a compressed part, a sparse COO gradient, a whole tensor), or a dense all-reduce
that completes later (`Pending`: DDP's other parameters, so they do not hold a lane up). Which scheme object
runs a part is decided here, once: the configured scheme, two-level sync wrapped around it for embedding rows
(`zen.twolevel.TwoLevel`), or a quantizer's own all-gather of codes (`zen.compress.base.GatherCodes`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import torch

from zen.comm.base import Communicator, Pending
from zen.comm.pool import MAX_BYTES
from zen.compress import Compressor, PartContext, make_compressor
from zen.compress.base import GatherCodes
from zen.device import accelerated
from zen.grad import LocalGrad, to_local_grad
from zen.output import Output, make_output
from zen.registry import Scheme, make_scheme
from zen.sync.config import SyncConfig
from zen.twolevel import NodeComms, TwoLevel
from zen.types import SyncStats, ZenInputError
from zen.validate import check_parts

DENSE = "allreduce"  # the scheme of every part that is not the configured scheme's
# the most a call may reserve for receives bounded by the tensor's rows: what the pool keeps (a receive buffer it
# cannot keep is allocated every call, and the pages a message touches fault in every time: at 2^24 rows, 600-1,000
# faults a call, more than the header round saved)
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
class Plan:
    """How one part travels: `scheme` (None: the dense all-reduce, asynchronous), whether the compressor
    takes it, and the rows view its scheme gets."""

    scheme: Scheme | None
    compressed: bool
    rows: bool


@dataclass
class Synchronizer:
    """One rank's configured synchronization over `comm` (and, two-level, its `nodes`): scheme instances per
    part key (a scheme's per-size state is about one tensor), one compressor with its residuals. `instance`
    fixes the scheme object (the functional `zen.sync`). `strict_two_level`: a COO tensor, a sparse result or
    a compressor with two-level nodes is an error (the functional API), not flat sync (the hook's other
    parts). `on_issue` learns of every asynchronous all-reduce as it is issued, so a caller can keep it in
    sight even when a later part of the same call fails (the hook must not exit with one in flight)."""

    config: SyncConfig
    comm: Communicator
    nodes: NodeComms | None = None
    instance: Scheme | None = None
    strict_two_level: bool = False
    compressor: Compressor | None = None  # None: made from the config (the hook shares one across its lanes)
    on_issue: Callable[[Pending], object] | None = None
    _schemes: dict[tuple[str, Hashable], Scheme] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        c = self.config
        if c.compress is not None and self.compressor is None:
            self.compressor = make_compressor(c.compress, c.density, **dict(c.compress_options))

    @property
    def sparse_input(self) -> bool:
        """Whether the configured scheme sends rows (a dense scheme takes parts as dense all-reduces)."""
        return getattr(self.scheme_for("", ()), "sparse_input", True)

    def scheme_for(self, name: str, key: Hashable) -> Scheme:
        """The instance of the configured scheme (`name` ""), or of `name`, for the part `key`."""
        if self.instance is not None and not name:
            return self.instance
        if (name, key) not in self._schemes:
            options = dict(self.config.options) if not name else {}
            self._schemes[name, key] = make_scheme(name or self.config.scheme, **options)
        return self._schemes[name, key]

    def plan(self, part: Part, everything_sparse: bool = True) -> Plan:
        """The route of a part: compressed when a compressor is set and the part is dense (embedding rows
        only with `compress_rows`, or when every part is the scheme's); a quantizer brings its own exchange;
        the scheme takes COO gradients, embedding rows and compressed parts (two-level around it for
        embedding rows), unless it is dense: then a part synchronized in place is an asynchronous all-reduce
        (as DDP's other parameters are)."""
        c = self.config
        compressed = (self.compressor is not None and not part.coo
                      and (not part.sparse or c.compress_rows or everything_sparse))
        if compressed and self.compressor is not None and self.compressor.own_exchange:
            return Plan(GatherCodes(self.compressor), True, False)
        in_place = part.out is part.tensor
        through = part.coo or not in_place or ((part.sparse or compressed) and self.sparse_input)
        if not through:
            return Plan(None, compressed, False)
        scheme = self.scheme_for("", part.key)
        if self.nodes is not None and not part.coo and not compressed:
            scheme = TwoLevel(scheme, self.nodes)
        return Plan(scheme, compressed, part.rows and not compressed and not part.coo)

    def run(self, parts: Sequence[Part], *, tag: object = None, check: bool | None = None, divisor: int = 1,
            step: int = 0, sizes_agreed: bool | None = None, everything_sparse: bool = True,
            check_stats: SyncStats | None = None) -> list[Outcome]:
        """One call over `parts`: see the module docstring. `check` (default: the config's `validate`) runs
        the input check, its bytes into `check_stats` (default: the first part's stats); `divisor` divides
        every result (a DDP mean); `step` counts optimizer steps (compressors' schedules); `sizes_agreed`
        (default: `check`): every rank's tensors are known to be alike, so a dense all-reduce sends no size."""
        comm, c = self.comm, self.config
        check = c.validate if check is None else check
        code = c.code(tag)
        comm.begin_call(code, sizes_agreed=check if sizes_agreed is None else sizes_agreed)
        if self.nodes is not None:
            self.nodes.begin_call(code, sizes_agreed=True)
        stats = [SyncStats() for _ in parts]
        try:  # everything a rank can refuse locally, before the check (so the others learn it there)
            plans = [self.plan(p, everything_sparse) for p in parts]
            grads = [self._prepare(p, plan, step) for p, plan in zip(parts, plans, strict=True)]
            outputs = [make_output(p.tensor, g, p.out, divisor, p.sparse_result) if plan.scheme is not None else None
                       for p, plan, g in zip(parts, plans, grads, strict=True)]
        except ZenInputError as local:
            if check and comm.world_size > 1:
                comm.traffic = (check_stats or stats[0]).traffic
                _share_failure(local, comm, c)
            raise
        if check:
            comm.traffic = (check_stats or stats[0]).traffic
            described = [(g, tuple(p.tensor.shape), _name(plan))
                         for g, p, plan in zip(grads, parts, plans, strict=True)]
            for grad, rows in zip(grads, check_parts(described, comm, check_finite=c.check_finite), strict=True):
                if rows is not None:
                    comm.announce(grad, rows)
        elif comm.sizes_agreed and comm.short_receives and comm.world_size > 1:  # no counts: M bounds them
            for grad, plan in zip(grads, plans, strict=True):
                if plan.scheme is not None and not isinstance(plan.scheme, TwoLevel) and (
                        bound := row_bound(grad, comm.world_size)) is not None:
                    comm.announce(grad, bound)
        return [self._sync(p, plan, grad, output, s, divisor)
                for p, plan, grad, output, s in zip(parts, plans, grads, outputs, stats, strict=True)]

    def _prepare(self, part: Part, plan: Plan, step: int) -> LocalGrad:
        """The part as this rank's rows: the compressor's choice (it overwrites the part), else the tensor
        as rows, the non-zero ones extracted once for a scheme that sends rows (two-level says per call:
        with dense node steps it extracts them from its shard instead)."""
        tensor = part.tensor
        if self.nodes is not None and self.strict_two_level:
            TwoLevel.refuse(tensor, part.sparse_result)
            if self.compressor is not None:
                raise ZenInputError("a compressor with two-level sync is not supported; sync flat")
        if plan.compressed:
            assert self.compressor is not None
            if tensor.layout != torch.strided:
                raise ZenInputError("a compressor needs a dense tensor")
            return self.compressor.compress(tensor, PartContext(part.key, part.tag, step, self.comm.world_size))
        grad = to_local_grad(tensor, plan.rows)
        if plan.scheme is None:
            return grad
        takes_rows = getattr(plan.scheme, "takes_rows", None)  # a scheme whose path varies by call (TwoLevel)
        if takes_rows(grad, self.comm) if takes_rows is not None else getattr(plan.scheme, "sparse_input", True):
            grad.rows()
        return grad

    def _sync(self, part: Part, plan: Plan, grad: LocalGrad, output: Output | None, stats: SyncStats,
              divisor: int) -> Outcome:
        comm = self.comm
        comm.traffic = stats.traffic
        if plan.compressed and self.compressor is not None:  # what it keeps for later, measured
            stats.extra["residual_norm"] = self.compressor.residual_norm(part.key, lazy=accelerated(grad.device))
        if plan.scheme is None:
            pending = comm.all_reduce_async(part.tensor, phase=DENSE)
            if divisor != 1:
                pending = pending.then(lambda t: t.div_(divisor))
            if self.on_issue is not None:
                self.on_issue(pending)
            return Outcome(part.tensor, stats, part.sparse, pending)
        assert output is not None
        plan.scheme(grad, comm, output, stats)
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


def _name(plan: Plan) -> str:
    return getattr(plan.scheme, "name", DENSE) if plan.scheme is not None else DENSE


def _share_failure(local: ZenInputError, comm: Communicator, config: SyncConfig) -> None:
    """Join the cross-rank check as a rank that failed locally, so the others raise too; then this rank
    raises its own error (chained to what the check said)."""
    try:
        check_parts(None, comm, check_finite=config.check_finite)
    except ZenInputError as shared:
        raise local from shared

