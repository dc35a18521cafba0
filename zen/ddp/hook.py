"""The DDP communication hook: each bucket's embedding rows through a Zen scheme, the rest dense, while
backward goes on.

Usage: `ddp.register_comm_hook(ZenHookState(scheme="zen", sparse_params=model), zen.ddp_hook)`.
The hook returns at once with a Future that completes when its bucket is synchronized. A bucket is a job
for one of `lanes` communication lanes (bucket index modulo lanes, the same on every rank): each lane is a
thread (zen.ddp.worker) with a process group and scheme instances of its own, running its buckets in DDP's
order. So DDP's own collectives (e.g. find_unused_parameters' bitmap all-reduce from the autograd thread)
cannot interleave with ours, and two buckets' exchanges can be in flight at once, as gloo's two threads
run DDP's built-in all-reduces. Dense parts are issued as asynchronous all-reduces and do not hold a lane
up; sparse parts run the scheme there. A step's last bucket runs in the hook call itself when its lane is
idle (nothing of backward is left to overlap). Errors and timeouts fail the futures, so `loss.backward()`
raises on every rank. Buckets arrive un-averaged; like DDP's own allreduce hook we return the mean unless
`average=False`. Scheme state is keyed by tensor size, not bucket index, so DDP's bucket rebuild after
iteration 1 is harmless. Every bucket is one call on its lane's communicator (zen.comm.base): its headers
carry the call number and a code of the hook's settings, so a rank configured differently raises at once on
every rank; tensor sizes are taken as agreed (DDP verified the parameters' shapes across ranks when it was
built and gives every rank the same buckets), so a dense part needs no size header.
No `from __future__ import annotations` here: DDP's register_comm_hook compares the hook's annotations
with the real classes and rejects strings.
"""

import datetime
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from zen.api import prepare, run
from zen.comm.base import code_of
from zen.comm.dist import DistComm, timeout_seconds
from zen.compress import Compressor, PartContext, make_compressor
from zen.ddp.router import BucketRouter, Part, embedding_params
from zen.ddp.worker import CommWorker, Fault, settle
from zen.launch import calm_gloo
from zen.registry import Scheme, make_scheme, scheme_config
from zen.twolevel import INTRA_MODES, NodeComms, dist_node_comms, nodes_of
from zen.types import SyncStats, ZenCommError, ZenInputError
from zen.validate import check_parts

T = TypeVar("T")
DENSE = "allreduce"  # every part that is not embedding rows
NONFINITE = ("pass", "raise")


@dataclass
class StepRecord:
    """What one step's synchronization did: per part its stats and whether it was embedding rows (one tuple,
    appended atomically by whichever lane ran it), and the (start, end) perf_counter spans during which the
    hook's work was in flight."""

    parts: list[tuple[SyncStats, bool]] = field(default_factory=list)
    spans: list[tuple[float, float]] = field(default_factory=list)

    @property
    def stats(self) -> list[SyncStats]:
        return [s for s, _ in self.parts]

    def busy_s(self) -> float:
        """Seconds during which some synchronization of this step was in flight (union of the spans)."""
        total, end = 0.0, float("-inf")
        for a, b in sorted(self.spans):
            if b > end:
                total += b - max(a, end)
                end = b
        return total

    def bytes_received(self, sparse_only: bool = False) -> int:
        return sum(s.traffic.bytes_received for s, sparse in self.parts if sparse or not sparse_only)


@dataclass
class Lane:
    """One communication lane: its communicator (process group), thread and scheme instances, and with
    `ranks_per_node` > 1 its node and inter-node sub-groups."""

    comm: DistComm
    worker: CommWorker
    make: Callable[[str], Scheme]
    nodes: NodeComms | None = None
    schemes: dict[tuple[str, tuple[int, ...]], Scheme] = field(default_factory=dict)

    def scheme(self, name: str, key: tuple[int, ...]) -> Scheme:
        """The instance of `name` for the part of these parameters (`Part.key`): one per part, because a
        scheme's per-size state is about one tensor (zen's measured gamma, its timed BP-or-HC trial and
        choice); two tables of one shape sharing an instance would compare one's BP time with the other's HC."""
        if (name, key) not in self.schemes:
            self.schemes[name, key] = self.make(name)
        return self.schemes[name, key]


@dataclass
class ZenHookState:
    """Hyper-parameters of the hook, its communication lanes, and the last step's record.

    `sparse_params`: the embeddings, as modules (every nn.Embedding / nn.EmbeddingBag inside, torchrec's
    collections included) and/or parameters; their rows go through `scheme`, everything else through dense
    allreduce. None: every bucket whole through `scheme`, flat. The cross-rank input check (one small
    all-gather per bucket, a round trip) runs on the first two steps, around DDP's bucket rebuild, then every
    `check_every` steps (0: no more), and on every step with `nonfinite="raise"`; `validate=False`: never.
    DDP gives every rank the same buckets, so what it catches later is rare (a rank configured differently
    from the start is caught at once). `nonfinite`: "pass" sums NaN / Inf like DDP's allreduce does
    (torch.amp.GradScaler needs to see them), "raise" makes them a ZenInputError on every rank. `lanes`:
    buckets in flight at once. `asynchronous=False` runs each bucket inside the hook call (no overlap with
    backward). `compress` names a compressor (zen.compress: "topk", "dgc", "randomk", "sign", "qsgd") of
    `density` (and `compress_options`) for every dense part, and with `compress_rows` for the embedding rows too
    (else those keep their natural sparsity); the result is the mean of what the ranks' compressors chose,
    exactly, and each part's residual norm is in its stats (`extra["residual_norm"]`). `ranks_per_node` > 1
    (it must divide the world size; the default group only): the embedding rows take the two-level path
    (zen.twolevel: dense inside each node of that many consecutive ranks, `scheme` across nodes); dense parts,
    compressed parts and COO gradients stay flat over all ranks; `intra="sparse"`: sparse node steps (for a
    node link not much faster than the uplink)."""

    scheme: str = "zen"
    group: dist.ProcessGroup | None = None
    options: dict[str, Any] = field(default_factory=dict)
    sparse_params: nn.Module | Iterable[nn.Module | torch.Tensor] | None = None
    average: bool = True
    validate: bool = True
    check_every: int = 100
    nonfinite: str = "pass"
    timeout_s: float | None = None
    lanes: int = 2
    asynchronous: bool = True
    compress: str | None = None
    density: float = 0.05
    compress_options: dict[str, Any] = field(default_factory=dict)
    compress_rows: bool = False
    ranks_per_node: int = 1
    intra: str = "dense"
    iteration: int = 0
    last_step: StepRecord = field(default_factory=StepRecord)
    _step: StepRecord = field(default_factory=StepRecord, repr=False)
    _router: BucketRouter | None = field(default=None, repr=False)
    _lanes: list[Lane] = field(default_factory=list, repr=False)
    _fault: Fault = field(default_factory=Fault, repr=False)
    _compressor: Compressor | None = field(default=None, repr=False)
    _keys: set[tuple[int, ...]] = field(default_factory=set, repr=False)
    _sparse_input: bool = field(default=True, repr=False)

    def __post_init__(self) -> None:
        if self.nonfinite not in NONFINITE:
            raise ZenInputError(f"nonfinite must be one of {NONFINITE}, got {self.nonfinite!r}")
        if self.check_every < 0:
            raise ZenInputError(f"check_every must be >= 0 (0: never), got {self.check_every}")
        if self.timeout_s is not None:
            timeout_seconds(self.timeout_s)
        if self.lanes < 1:
            raise ZenInputError(f"lanes must be >= 1, got {self.lanes}")
        self._check_ranks_per_node()
        if self.intra not in INTRA_MODES:
            raise ZenInputError(f"intra must be one of {INTRA_MODES}, got {self.intra!r}")
        # unknown names and bad options fail here, not inside backward
        self._sparse_input = self._make_scheme(self.scheme).sparse_input
        if self.compress is not None:
            self._compressor = make_compressor(self.compress, self.density, **self.compress_options)
        self._router = BucketRouter(None if self.sparse_params is None else embedding_params(self.sparse_params))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(group=None, _lanes=[], _fault=Fault(), sparse_params=None, _keys=set())
        return state

    def _check_ranks_per_node(self) -> None:
        """ZenInputError (alike on every rank) for a ranks_per_node the world cannot be cut into."""
        if self.ranks_per_node < 1:
            raise ZenInputError(f"ranks_per_node must be >= 1 (1: flat), got {self.ranks_per_node}")
        if self.ranks_per_node > 1 and self.group is not None:
            raise ZenInputError("zen: ranks_per_node > 1 needs the default group (group=None): its node groups "
                                "are made of all ranks")
        if dist.is_available() and dist.is_initialized():  # else checked when the lanes are made
            nodes_of(dist.get_world_size(), self.ranks_per_node)

    @property
    def call_code(self) -> int:
        """What every rank's hook must agree on, as the code its calls carry (zen.comm.base)."""
        squeeze = self._compressor.config if self._compressor is not None else None
        two_level = f"|ranks_per_node={self.ranks_per_node}|{self.intra}" if self.ranks_per_node > 1 else ""
        return code_of(f"hook|{scheme_config(self.scheme, self.options)}|validate={self.validate}|"
                       f"check_every={self.check_every}|nonfinite={self.nonfinite}|average={self.average}|"
                       f"compress={squeeze}|rows={self.compress_rows}" + two_level)

    def bytes_received_last_step(self) -> int:
        return self.last_step.bytes_received()

    def _make_scheme(self, name: str) -> Scheme:
        return make_scheme(name, **(self.options if name == self.scheme else {}))

    def lane(self, bucket_index: int) -> Lane:
        """The lane of a bucket; all lanes are made at the first call, on every rank at the same point (the
        first bucket), each with a process group of its own over `group`'s ranks (and, two-level, sub-groups
        of its own, made once every rank is known to want the same ones)."""
        if not self._lanes:
            timeout = datetime.timedelta(seconds=timeout_seconds(self.timeout_s))
            groups = [self._created(lambda: self.group if self.group is not None else dist.new_group(timeout=timeout))
                      for _ in range(1 if self.group is not None else self.lanes)]
            comms = [DistComm(group, timeout_s=self.timeout_s) for group in groups]
            self._agree_ranks_per_node(comms[0])
            self._lanes = [self._new_lane(k, comm) for k, comm in enumerate(comms)]
            calm_gloo(dist.get_backend(groups[0]))  # the new groups' event loops (and a torchrun world's)
        return self._lanes[bucket_index % len(self._lanes)]

    def _created(self, make: Callable[[], T]) -> T:
        """`make()` (process groups): a peer that never reaches its first bucket is a ZenCommError."""
        try:
            return make()
        except Exception as exc:
            raise ZenCommError(f"zen: the hook's process group could not be created (a peer missing or late "
                               f"by more than {timeout_seconds(self.timeout_s):.0f}s): {exc}") from exc

    def _agree_ranks_per_node(self, comm: DistComm) -> None:
        """Two-level: every rank must make the same sub-groups, so they compare ranks_per_node first (a rank
        with 1 meets this gather with its first bucket's call instead: misaligned calls, a ZenCommError)."""
        if self.ranks_per_node == 1:
            return
        nodes_of(comm.world_size, self.ranks_per_node)
        mine = torch.tensor([self.ranks_per_node], dtype=torch.int64, device=comm.device)
        seen = comm.all_gather_fixed(mine).view(-1).tolist()
        if len(set(seen)) > 1:
            raise ZenInputError(f"zen: rank {comm.rank}: ranks_per_node differs across ranks ({seen})")

    def _new_lane(self, k: int, comm: DistComm) -> Lane:
        nodes = None
        if self.ranks_per_node > 1:
            nodes = self._created(lambda: dist_node_comms(self.ranks_per_node, self.timeout_s, self.intra))
        setup = (lambda: torch.cuda.set_device(comm.device)) if comm.device.type == "cuda" else None
        return Lane(comm, CommWorker(name=f"zen-comm-{k}", setup=setup, fault=self._fault), self._make_scheme, nodes)

    def squeezes(self, part: Part) -> bool:
        """Whether the compressor takes this part: dense parts, and embedding rows with `compress_rows` (or
        when no embeddings were named: every bucket whole)."""
        assert self._router is not None
        rows_too = self.compress_rows or self._router.everything_sparse
        return self._compressor is not None and not part.coo and (not part.sparse or rows_too)

    def check_due(self) -> bool:
        periodic = self.check_every > 0 and self.iteration % self.check_every == 0
        return self.validate and (self.iteration < 2 or periodic or self.nonfinite == "raise")


def ddp_hook(state: ZenHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """hook(state, bucket) -> Future of the synchronized bucket buffer (COO for a sparse gradient)."""
    assert state._router is not None
    parts = state._router.split(bucket)
    step, check, lane = state._step, state.check_due(), state.lane(bucket.index())
    code = code_of(f"{state.call_code}|step={state.iteration}|bucket={bucket.index()}")  # a skipped step shows
    done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    ctxs = [PartContext(p.key, bucket.index() * 1_024 + i, state.iteration, lane.comm.world_size)
            if state.squeezes(p) else None for i, p in enumerate(parts)]
    state._keys.update(p.key for p in parts)

    def job() -> None:
        _sync_bucket(state, lane, bucket.buffer(), parts, ctxs, step, check, code, done)

    if state.asynchronous:
        lane.worker.submit(job, done, inline_if_idle=bucket.is_last())
    else:
        try:
            job()
        except Exception as exc:  # noqa: BLE001 - the future carries it to backward, as in the async case
            state._fault.fail(done, exc)
    if bucket.is_last():
        if state._compressor is not None:  # DDP rebuilt its buckets: the old parts' residuals go
            state._compressor.prune(state._keys)
        state.iteration += 1
        state.last_step, state._step, state._keys = step, StepRecord(), set()
    return done.then(_unwrap)


def _unwrap(fut: torch.futures.Future) -> torch.Tensor:
    """The result, or the error as a failed future that DDP's C++ side sees as one (a Python exception set
    on a Future is only a value to it): backward then raises it with its type and message."""
    try:
        return fut.value()
    except Exception as exc:
        raise RuntimeError(f"{type(exc).__name__}: {exc}") from exc


def _sync_bucket(state: ZenHookState, lane: Lane, buffer: torch.Tensor, parts: list[Part],
                 ctxs: list[PartContext | None], step: StepRecord, check: bool, code: int,
                 done: torch.futures.Future) -> None:
    """One bucket: its parts compressed (where `ctxs` says), one input check for all of them (if due), the
    dense parts' all-reduces issued, the sparse parts synchronized; `done` completes when the all-reduces
    have too."""
    comm, nodes = lane.comm, lane.nodes
    comm.begin_call(code, sizes_agreed=True)
    if nodes is not None:
        nodes.begin_call(code, sizes_agreed=True)
    divisor = comm.world_size if state.average else 1
    squeezer = state._compressor
    own = [c is not None and squeezer is not None and squeezer.own_exchange for c in ctxs]  # a quantizer's
    # embedding rows, COO gradients and compressed parts through the scheme; the rest (or all if the scheme
    # is dense) async
    through = [p.coo or ((p.sparse or c is not None) and state._sparse_input and not o)
               for p, c, o in zip(parts, ctxs, own, strict=True)]
    names = [state.scheme if t else DENSE for t in through]
    schemes = [lane.scheme(n, p.key) for n, p in zip(names, parts, strict=True)]
    grads = [prepare(scheme, p.tensor, rows=t and not p.coo and c is None,
                     extract=nodes is None or nodes.mode == "sparse" or p.coo or c is not None,
                     compressor=squeezer if c is not None else None, ctx=c)
             for p, scheme, t, c in zip(parts, schemes, through, ctxs, strict=True)]
    start = time.perf_counter()
    if check:
        meta = SyncStats()
        step.parts.append((meta, False))
        comm.traffic = meta.traffic
        check_parts([(g, tuple(p.tensor.shape), n) for g, p, n in zip(grads, parts, names, strict=True)], comm,
                    check_finite=state.nonfinite == "raise")
    pending, result = [], buffer
    for part, scheme, grad, scheme_path, ctx, quantized in zip(parts, schemes, grads, through, ctxs, own, strict=True):
        stats = SyncStats()
        step.parts.append((stats, part.sparse))
        if quantized:
            assert squeezer is not None and ctx is not None
            comm.traffic = stats.traffic
            squeezer.exchange(part.tensor, ctx, comm, part.tensor, divisor)
            step.spans.append((start, time.perf_counter()))
        elif scheme_path:
            out, _ = run(scheme, part.tensor, grad, comm, None if part.coo else part.tensor, divisor,
                         sparse_result=part.coo, stats=stats, nodes=None if part.coo or ctx is not None else nodes)
            step.spans.append((start, time.perf_counter()))
            result = out if part.coo else result
        else:
            pending.append(state._fault.track(_dense_part(comm, part.tensor, divisor, stats, step, start)))
        if ctx is not None and squeezer is not None:
            stats.extra["residual_norm"] = squeezer.residual_norm(ctx.key)
        start = time.perf_counter()
    settle(done, result, pending, state._fault)


def _dense_part(comm: DistComm, tensor: torch.Tensor, divisor: int, stats: SyncStats, step: StepRecord,
                start: float) -> torch.futures.Future:
    """A dense part's asynchronous all-reduce; the future divides it and records its span."""
    comm.traffic = stats.traffic
    summed = comm.all_reduce_async(tensor, phase=DENSE)

    def finish(fut: torch.futures.Future) -> torch.Tensor:
        result = fut.value()
        if divisor != 1:
            result.div_(divisor)
        step.spans.append((start, time.perf_counter()))
        return result

    return summed.then(finish)
