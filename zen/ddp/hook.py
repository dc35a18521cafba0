"""The DDP communication hook: each bucket's embedding rows through a Zen scheme, the rest dense, while
backward goes on.

Usage: `ddp.register_comm_hook(ZenHookState(scheme="zen", sparse_params=model), zen.ddp_hook)`.
The hook returns at once with a Future that completes when its bucket is synchronized. A bucket is a job
for one of the communication lanes (bucket index modulo lanes, the same on every rank): each lane is a
thread (zen.ddp.worker) with a process group, a communication stream (zen.device) and a synchronizer
(zen.core) of its own, running its buckets in DDP's order. So DDP's own collectives (e.g.
find_unused_parameters' bitmap all-reduce from the autograd thread) cannot interleave with ours. On gloo,
`lanes` buckets can be in flight at once, as gloo's two threads run DDP's built-in all-reduces; on NCCL one
lane issues everything in bucket order (operations of two communicators issued in a rank-dependent order can
deadlock there, and the device already overlaps them), and the step's last bucket waits in the hook call until
the lane has issued the rest, then runs there: DDP's own collectives of the step's end come after all of ours on
every rank (zen.ddp.worker.CommWorker.submit). The lane's stream waits for an event recorded when DDP
calls the hook (backward's writes of the bucket), and the Future handed back carries the stream dependency
DDP needs (zen.device.result_future), so no host wait sits on backward's stream.

Dense parts are issued as asynchronous all-reduces and do not hold a lane up; sparse parts run the scheme
there. A step's last bucket runs in the hook call itself when its lane is idle (nothing of backward is left to
overlap). Errors and timeouts fail the futures, so `loss.backward()` raises on every rank. Buckets arrive
un-averaged; like DDP's own allreduce hook we return the mean unless `average=False`. Scheme state is keyed
by the part's parameters, not the bucket index, so DDP's bucket rebuild after iteration 1 is harmless. Every
bucket is one call on its lane's communicator (zen.comm.base): its headers carry the call number and the
code of the hook's configuration (zen.core.SyncConfig), so a rank configured differently raises at once on
every rank; tensor sizes are taken as agreed (DDP verified the parameters' shapes across ranks when it was
built and gives every rank the same buckets), so a dense part needs no size header.
No `from __future__ import annotations` here: DDP's register_comm_hook compares the hook's annotations
with the real classes and rejects strings.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from zen.comm.dist import DistComm, group_timeout_for, timeout_seconds
from zen.compress import Compressor
from zen.core import Part, SyncConfig, Synchronizer
from zen.core.build import agree_nodes, build, check_nodes, compressor_for, dist_comm, dist_nodes
from zen.ddp.router import BucketRouter, embedding_params
from zen.ddp.worker import CommWorker, Fault, settle
from zen.device import Clock, Stream, join, on, result_future
from zen.registry import make_scheme
from zen.types import SyncStats, ZenCommError, ZenInputError

T = TypeVar("T")


@dataclass
class StepRecord:
    """What one step's synchronization did: per part its stats and whether it was embedding rows (one tuple,
    appended atomically by whichever lane ran it), and per bucket a clock spanning the time its work was in
    flight (device time on a GPU)."""

    parts: list[tuple[SyncStats, bool]] = field(default_factory=list)
    spans: list[Clock] = field(default_factory=list)

    @property
    def stats(self) -> list[SyncStats]:
        return [s.resolved() for s, _ in self.parts]

    def busy_s(self) -> float:
        """Seconds during which some synchronization of this step was in flight (union of the spans)."""
        if not self.spans:
            return 0.0
        ref = self.spans[0]
        total, end = 0.0, float("-inf")
        for a, b in sorted(c.interval(ref) for c in self.spans):
            if b > end:
                total += b - max(a, end)
                end = b
        return total

    def bytes_received(self, sparse_only: bool = False) -> int:
        return sum(s.traffic.bytes_received for s, sparse in self.parts if sparse or not sparse_only)


@dataclass
class Lane:
    """One communication lane: its communicator (process group), thread, stream and synchronizer."""

    comm: DistComm
    worker: CommWorker
    stream: Stream
    syncer: Synchronizer


@dataclass
class HookRuntime:
    """What the hook keeps between calls (not settings): the router, the configuration every rank agrees on,
    the lanes (opened at the first bucket), the shared compressor, the step's number and records, the fault of
    all lanes."""

    config: SyncConfig
    router: BucketRouter
    compressor: Compressor | None
    opened: list[Lane] = field(default_factory=list)  # the lanes, opened at the first bucket
    fault: Fault = field(default_factory=Fault)
    step: int = 0  # the step under way (optimizer steps whose last bucket the hook has seen)
    record: StepRecord = field(default_factory=StepRecord)  # that step's record
    last_step: StepRecord = field(default_factory=StepRecord)  # the last finished step's record
    keys: set[Any] = field(default_factory=set)


@dataclass
class ZenHookState:
    """The hook's settings, one field each (what it trades, its default, when to change it). What the hook keeps
    between calls (lanes, router, compressor, the step's number and record) is its `HookRuntime`, apart; the
    step's number and the last step's record read through `iteration` and `last_step`.

    What goes through the scheme:

    - `scheme` ("zen"): the scheme of the embedding rows (zen.schemes()); `options` ({}): its keyword options
      (zen's `hc_ids`, ...). Change it to compare a baseline; unknown names and bad options fail here.
    - `sparse_params` (None): the embeddings, as modules (every nn.Embedding / nn.EmbeddingBag inside,
      torchrec's collections included) and/or parameters; their rows go through `scheme`, everything else
      through dense all-reduces that overlap them. None: every bucket whole through `scheme`, flat (the paper's
      view of a bucket). Give it for any model with tables: the dense parameters gain nothing from a sparse
      scheme and then do not wait for it.
    - `average` (True): the mean over ranks, as DDP's own hook returns; False: the sum (an optimizer that divides
      itself).
    - `group` (None: the default group): the ranks to sum over. A group given is used as it is, with one lane
      (no groups of the hook's own) and no two-level sync.

    The input check (one small all-gather per bucket, a round trip):

    - `validate` (True): False never checks, saving the round trip on the first steps; a rank configured
      differently is then still caught by the call's headers, but a tensor that differs is not.
    - `check_every` (100): after the first two steps (around DDP's bucket rebuild) the check runs every that many
      steps; 0: never again. DDP gives every rank the same buckets, so what a later check catches is rare, and
      between checks a bucket's messages are bounded by its rows (gloo exchanges still take one round,
      zen.core.synchronizer.row_bound). Lower it while debugging a model whose parameters change shape.
    - `nonfinite` ("pass"): "pass" sums NaN / Inf like DDP's all-reduce does (torch.amp.GradScaler needs to see
      them); "raise" makes them a ZenInputError on every rank, and then checks every step (a round trip each).

    How the buckets travel:

    - `lanes` (2): buckets in flight at once on gloo, each lane a thread with a process group of its own; more
      lanes overlap more of backward on a link with latency to hide, at one more process group each. NCCL and a
      given `group` use one (operations of two communicators issued in a rank-dependent order can deadlock).
    - `asynchronous` (True): buckets run on their lane while backward goes on; False runs each inside the hook
      call, on backward's thread (no overlap; needed where several hooks share one group, as torchrec's wrapper
      does, so every rank issues their collectives in one order).
    - `timeout_s` (None: $ZEN_TIMEOUT_S, else 300 s): how long any wait for a peer lasts before a ZenCommError on
      every rank. Raise it for a first step that compiles or loads for long; lower it to fail fast in tests.
    - `gloo_batch` (False): put gloo's event-loop threads of the hook's groups under SCHED_BATCH
      (zen.comm.scheduling): fewer wake-ups where ranks share cores; opt-in, as it changes this process's threads.

    Compression of dense gradients (zen.compress):

    - `compress` (None): a compressor ("topk", "dgc", "randomk", "sign", "qsgd") for every dense part: the result
      is the mean of what the ranks' compressors chose, exactly, what they left out kept as a residual for later
      steps (each part's residual norm in its stats, `extra["residual_norm"]`). Trades convergence per step for
      bytes: use it where dense parameters dominate the traffic.
    - `density` (0.05): the share of a part's elements a sparsifier sends (a quantizer ignores it); lower sends
      fewer bytes and leaves more in the residual.
    - `compress_options` ({}): the compressor's own options (DGC's momentum, a seed, ...).
    - `compress_rows` (False): the embedding rows through the compressor too; else they keep their natural
      sparsity, which is exact and usually already small.

    Nodes of several ranks (zen.twolevel):

    - `ranks_per_node` (1): > 1 (dividing the world size; the default group only) sends the embedding rows the
      two-level way: summed inside each node of that many consecutive ranks over its fast link, `scheme` across
      nodes, so rows the node's ranks share cross the uplink once. Dense parts, compressed parts and COO gradients
      stay flat. Set it to the GPUs per machine where the machines' link is the slow one.
    - `intra` ("auto"): the node steps: "auto" times dense, sparse and none at each part size's first calls and
      keeps the fastest; "dense" (the paper's) or "sparse" (for a node link not much faster than the uplink) fix
      them and skip the trial."""

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
    intra: str = "auto"
    gloo_batch: bool = False
    _runtime: HookRuntime | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.timeout_s is not None:
            timeout_seconds(self.timeout_s)
        if self.lanes < 1:
            raise ZenInputError(f"lanes must be >= 1, got {self.lanes}")
        config = SyncConfig(
            scheme=self.scheme, options=self.options, compress=self.compress, density=self.density,
            compress_options=self.compress_options, compress_rows=self.compress_rows or self.sparse_params is None,
            ranks_per_node=self.ranks_per_node, intra=self.intra, flat_fallback=True, validate=self.validate,
            check_every=self.check_every, nonfinite=self.nonfinite, sizes_agreed=True,
            extra={"average": self.average})
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else None
        check_nodes(config, world, self.group)  # else the world is checked when the lanes are made
        make_scheme(self.scheme, **self.options)  # unknown names and bad options fail here, not inside backward
        router = BucketRouter(None if self.sparse_params is None else embedding_params(self.sparse_params))
        self._runtime = HookRuntime(config, router, compressor_for(config))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(group=None, sparse_params=None, _runtime=None)
        return state

    @property
    def runtime(self) -> HookRuntime:
        assert self._runtime is not None, "a ZenHookState unpickled without its runtime: build a new one"
        return self._runtime

    @property
    def iteration(self) -> int:
        """The step under way: optimizer steps the hook has seen end (its last bucket)."""
        return self.runtime.step

    @iteration.setter
    def iteration(self, step: int) -> None:
        self.runtime.step = step

    @property
    def last_step(self) -> StepRecord:
        """What the last finished step's synchronization did (per part its stats; busy time)."""
        return self.runtime.last_step

    def bytes_received_last_step(self) -> int:
        return self.last_step.bytes_received()

    def lane(self, bucket: dist.GradBucket) -> Lane:
        """The lane of a bucket; all lanes are made at the first call, on every rank at the same point (the
        first bucket), each with a process group of its own over `group`'s ranks (and, two-level, sub-groups
        of its own, made once every rank is known to want the same ones)."""
        rt = self.runtime
        if not rt.opened:
            device = bucket.buffer().device
            timeout = group_timeout_for(timeout_seconds(self.timeout_s))  # Zen's deadline ends before its watchdog
            first = self._created(lambda: self.group if self.group is not None else dist.new_group(timeout=timeout))
            comms = [dist_comm(first, self.timeout_s, device)]
            count = 1 if self.group is not None or comms[0].rules.ordered else self.lanes
            for _ in range(count - 1):
                comms.append(dist_comm(self._created(lambda: dist.new_group(timeout=timeout)), self.timeout_s, device))
            agree_nodes(rt.config, comms[0])
            rt.opened = [self._new_lane(k, comm) for k, comm in enumerate(comms)]
            if self.gloo_batch:
                from zen.comm.scheduling import calm_gloo

                calm_gloo(comms[0].backend)
        return rt.opened[bucket.index() % len(rt.opened)]

    def _created(self, make: Callable[[], T]) -> T:
        """`make()` (process groups): a peer that never reaches its first bucket is a ZenCommError."""
        try:
            return make()
        except Exception as exc:
            raise ZenCommError(f"zen: the hook's process group could not be created (a peer missing or late "
                               f"by more than {timeout_seconds(self.timeout_s):.0f}s): {exc}") from exc

    def _new_lane(self, k: int, comm: DistComm) -> Lane:
        rt = self.runtime
        nodes = self._created(lambda: dist_nodes(rt.config, comm, self.group))
        syncer = build(rt.config, comm, nodes, compressor=rt.compressor, on_issue=rt.fault.track)
        worker = CommWorker(name=f"zen-comm-{k}", device=comm.device, fault=rt.fault)
        return Lane(comm, worker, Stream(comm.device), syncer)

    def check_due(self) -> bool:
        """Whether this step's buckets run the cross-rank input check."""
        return self.runtime.config.check_due(self.iteration)


def ddp_hook(state: ZenHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """hook(state, bucket) -> Future of the synchronized bucket buffer (COO for a sparse gradient)."""
    rt = state.runtime
    parts = rt.router.split(bucket)
    record, lane = rt.record, state.lane(bucket)
    tag = (state.iteration, bucket.index())  # a skipped step or bucket shows in the headers
    done = result_future(lane.comm.device)
    mark = lane.stream.mark()  # backward's writes of this bucket, on DDP's stream
    rt.keys.update(p.key for p in parts)
    job = BucketJob(state, lane, bucket.buffer(), parts, record, tag, mark, done)

    if state.asynchronous:
        lane.worker.submit(job.run, done, inline_if_idle=bucket.is_last(),
                           inline_after_drain=bucket.is_last() and lane.comm.rules.ordered)
    else:
        try:
            job.run()
        except Exception as exc:  # noqa: BLE001 - the future carries it to backward, as in the async case
            rt.fault.fail(done, exc)
    if bucket.is_last():
        if rt.compressor is not None:  # DDP rebuilt its buckets: the old parts' residuals go
            rt.compressor.prune(rt.keys)
        rt.step += 1
        rt.last_step, rt.record, rt.keys = record, StepRecord(), set()
    return done.then(_unwrap)


def _unwrap(fut: torch.futures.Future) -> torch.Tensor:
    """The result, or the error as a failed future that DDP's C++ side sees as one (a Python exception set
    on a Future is only a value to it): backward then raises it with its type and message."""
    try:
        return fut.value()
    except Exception as exc:
        raise RuntimeError(f"{type(exc).__name__}: {exc}") from exc


@dataclass
class BucketJob:
    """One bucket's synchronization, as its lane runs it: the synchronizer's call over the bucket's parts (one
    input check for all of them, when the configuration says it is due) on the lane's stream after backward's
    writes of the bucket (`mark`), then `done` once the dense parts' all-reduces have completed too
    (zen.ddp.worker.settle). `tag` (the step and the bucket's index) names the call in its headers."""

    state: ZenHookState
    lane: Lane
    buffer: torch.Tensor
    parts: list[Part]
    record: StepRecord
    tag: tuple[int, int]
    mark: Any
    done: torch.futures.Future

    def run(self) -> None:
        state, lane, record, rt = self.state, self.lane, self.record, self.state.runtime
        with on(lane.comm.device), lane.stream.use():
            lane.stream.waits(self.mark)
            clock = Clock(lane.comm.device).start()
            call = lane.syncer.run(self.parts, tag=self.tag, step=self.tag[0],
                                   divisor=lane.comm.world_size if state.average else 1)
            if call.check is not None:
                record.parts.append((call.check, False))
            outcomes = call.outcomes
            result = self.buffer
            for part, outcome in zip(self.parts, outcomes, strict=True):
                record.parts.append((outcome.stats, outcome.sparse))
                if part.sparse_result:
                    result = outcome.result
            pending = [o.pending for o in outcomes if o.pending is not None]  # tracked as issued (on_issue)
            record.spans.append(clock)
            written = lane.stream.mark()  # the sparse parts' writes, on the lane's stream
            settle(self.done, result, pending, rt.fault, on_done=clock.stop,
                   after=lambda: join(written, lane.comm.device))
