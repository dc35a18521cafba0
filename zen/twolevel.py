"""Two-level synchronization for nodes of several ranks (paper section 5, step 2): a dense reduce-scatter
inside each node (its fast local link: NVLink, or loopback in the emulated cluster), the chosen scheme across
nodes on each shard, then an all-gather inside the node.

Why: the slow link is the node's. Flat, each of a node's k ranks syncs its own gradient over it; two-level,
the node's sum crosses it once, split in k shards, and that sum is only as dense as the union of the k ranks'
rows (gamma^k d_G, at most k d_G), so the scheme's sparse traffic shrinks wherever the ranks' rows overlap.

Layout: ranks n*k .. n*k + k - 1 form node n (k = ranks per node, as torchrun numbers them); local rank j of
every node forms the inter-node group that syncs shard j, the j-th of k contiguous blocks of rows
(`shard_bounds`: sizes differ by at most one row; fewer rows than k leaves the last shards empty, and an
empty shard skips the inter-node step on every node alike). The k inter-node groups run side by side.
Lossless: a node's shard sum (its ranks' parts added in local-rank order) is summed across nodes by the
scheme, bit-identical on the group's ranks, and the all-gather copies those bits, so every rank holds the
same sum.

`intra="auto"` (the default) picks per tensor size, as zen's selector picks BP or HC, among dense node steps,
sparse ones and no node steps at all (the scheme flat over every rank, for links where two-level does not pay):
the first calls take turns (`IntraTrial`), each timed once the scheme inside has settled its own path there (zen
times BP and HC in its first calls of a size), and every rank keeps the one whose calls took least at their
slowest rank, in the median call (an all-gather of every rank's trial times, once). The simulated group has no
clock: it keeps the paper's dense steps. `intra="dense"` or `"sparse"` fixes the mode.

`intra="sparse"` replaces both dense node steps by sparse ones, for nodes whose local link is not much faster
than their uplink (the emulated cluster's loopback on a few shared cores, unlike NVLink). Its shards are
interleaved, not contiguous: row r belongs to shard r % k, as row r // k there (`interleaved_rows`), so a skewed
gradient (hot rows at low ids, as in a zipf table) spreads evenly over the k inter-node groups instead of
loading one. Both steps carry rows only, never a dense shard: each rank sends local rank j its non-zero rows of
shard j (an all_to_all_v of COO rows), which merges them in local-rank order into the node's shard rows; the
scheme syncs those into a rows result (`RowsOutput`), and the all-gather carries each shard's result rows. Same
sums, same bits on every rank.

Bytes land in the call's SyncStats under phase names that say the link class: "intra:" (reduce_scatter,
all_gather and their meta) and "inter:" (the scheme's own phases: push, pull, ...); the input check runs
over all ranks (plain "meta"). `zen.prediction.predict(..., ranks_per_node=k)` predicts them exactly.
"""

from __future__ import annotations

import copy
import statistics
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist

from zen import native
from zen.comm.base import Communicator, count_meta, gather_v_meta, ring_chunk
from zen.comm.dist import DistComm, group_timeout_for, timeout_seconds
from zen.comm.sim import SimComm, SimGroup
from zen.device import Clock
from zen.grad import LocalGrad, to_local_grad
from zen.output import DenseOutput, Output, RowSet, RowsOutput, make_output, union_rows
from zen.registry import Scheme
from zen.route import Flat, sends_rows
from zen.types import PhaseBytes, SyncStats, WireLayout, ZenInputError

INTRA = "intra:"  # phases on a node's local link
INTER = "inter:"  # phases on the node's uplink
INTRA_MODES = ("auto", "dense", "sparse")  # the node steps: timed choice, the paper's dense shards, sparse rows
TRIAL_CALLS = 4  # timed calls of each candidate before `intra="auto"` chooses
CANDIDATES = ("dense", "sparse", "flat")  # what `intra="auto"` times: the two kinds of node steps, and none
TIE = 0.05  # `intra="auto"`: candidates within this fraction of the fastest tie, and the earlier one wins


def nodes_of(world_size: int, ranks_per_node: int) -> int:
    """The number of nodes; ZenInputError unless `ranks_per_node` >= 1 divides the world size."""
    if ranks_per_node < 1 or world_size % ranks_per_node:
        raise ZenInputError(f"zen: ranks_per_node must be >= 1 and divide the world size {world_size} "
                            f"(equal nodes), got {ranks_per_node}")
    return world_size // ranks_per_node


def node_groups(world_size: int, ranks_per_node: int) -> list[list[int]]:
    """The ranks of every node, then those of every local rank across the nodes: the sub-groups, in the
    order every rank creates them."""
    k = ranks_per_node
    nodes = nodes_of(world_size, k)
    return [list(range(n * k, (n + 1) * k)) for n in range(nodes)] + [list(range(j, world_size, k)) for j in range(k)]


def shard_bounds(rows: int, shards: int) -> list[int]:
    """Row offsets of `shards` contiguous shards, cut as the ring all-reduce cuts its chunks (the first
    rows % shards shards one row longer): no shard is more than one row longer than another."""
    bounds = [0]
    for j in range(shards):
        bounds.append(bounds[-1] + ring_chunk(rows, shards, j))
    return bounds


@dataclass
class NodeComms:
    """One rank's two sub-group communicators: `intra` over its node (its rank there: the local rank) and
    `inter` over the same local rank of every node (its rank there: the node)."""

    intra: Communicator
    inter: Communicator
    mode: str = "auto"  # the node steps: timed choice, dense (the paper's) or sparse rows (INTRA_MODES)
    trials: dict[tuple, IntraTrial] = field(default_factory=dict)  # `auto`: per tensor size, its trial

    def __post_init__(self) -> None:
        if self.mode not in INTRA_MODES:
            raise ZenInputError(f"zen: intra must be one of {INTRA_MODES}, got {self.mode!r}")

    @property
    def ranks_per_node(self) -> int:
        return self.intra.world_size

    def steps_for(self, scheme: str, grad: LocalGrad, comm: Communicator,
                  settling: Callable[[Communicator], int]) -> IntraTrial:
        """The node steps of this call of `scheme` for `grad`'s size (auto: its trial); `comm` is the world's.
        `settling(c)`: the calls the scheme spends choosing its own path on communicator `c` (flat runs it on
        the world's, the node steps on `inter`), which the trial runs but does not time."""
        key = (self.mode, scheme, grad.num_rows, grad.row_width, grad.dtype)
        if key not in self.trials:
            self.trials[key] = IntraTrial(self._fixed(comm), self._settle(settling, comm))
        return self.trials[key]

    def settling_calls(self, settling: Callable[[Communicator], int], comm: Communicator) -> int:
        """Calls of one tensor size before two-level sync keeps one path (auto: every candidate's settling and
        timed calls; else the scheme's own choosing on `inter`; `settling` as in `steps_for`)."""
        if self._fixed(comm) is not None:
            return settling(self.inter)
        return sum(calls + TRIAL_CALLS for calls in self._settle(settling, comm).values())

    def _fixed(self, comm: Communicator) -> str | None:
        """The node steps without a trial: the configured ones, or dense where nothing can be timed."""
        return self.mode if self.mode != "auto" else None if comm.clocked and comm.world_size > 1 else "dense"

    def _settle(self, settling: Callable[[Communicator], int], comm: Communicator) -> dict[str, int]:
        return {m: settling(comm if m == "flat" else self.inter) for m in CANDIDATES}

    def begin_call(self, code: int, sizes_agreed: bool = False) -> None:
        """Both sub-groups start the call the world communicator starts (`Communicator.begin_call`)."""
        self.intra.begin_call(code, sizes_agreed)
        self.inter.begin_call(code, sizes_agreed)


@dataclass
class IntraTrial:
    """`intra="auto"` for one tensor size: the CANDIDATES take turns (dense, sparse, flat, dense, ...); each
    first runs the calls its scheme spends choosing its own path there (`settle`: zen's measuring BP and timed
    HC calls, which would otherwise be what the trial compares), then TRIAL_CALLS timed calls; then the
    fastest for good (`chosen`). Every rank runs the same calls in the same order (`settle` comes from the
    configuration and the group sizes), so they agree on which call is which; the choice comes from one
    all-gather, so they agree on it too."""

    chosen: str | None = None
    settle: dict[str, int] = field(default_factory=dict)  # untimed calls of each candidate first
    calls: dict[str, int] = field(default_factory=lambda: {m: 0 for m in CANDIDATES})
    times: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in CANDIDATES})
    copies: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)  # scheme -> candidate -> copy

    def mode(self) -> str:
        if self.chosen is not None:
            return self.chosen
        return min(CANDIDATES, key=lambda m: self.calls[m])  # the first with the fewest calls: turns

    def scheme_for(self, mode: str, inner: Scheme) -> Scheme:
        """The scheme instance candidate `mode` runs (and keeps, if chosen) for this tensor size: its own copy, so
        that one candidate's calls do not settle another's path (dense and sparse node steps both hand the scheme
        shards of M / k rows: zen's BP-or-HC choice for that size would be timed on both, half each), and so that
        local rank j's copy sees the calls of this size alone: shard j of two sizes can have one shard size, and
        zen's shard groups choose together (`Communicator.shared_link`), in the same call on every local rank.
        Copies per scheme object: parts of one size share the trial, not their schemes' state."""
        mine = self.copies.setdefault(inner, {})
        if mode not in mine:
            mine[mode] = copy.deepcopy(inner)
        return mine[mode]

    def record(self, mode: str, seconds: float, comm: Communicator) -> None:
        """One trial call's time (kept once the candidate's scheme has settled); after the last, the choice:
        per candidate the median over its timed calls of the call's slowest rank, then the earliest candidate
        within TIE of the fastest (node steps unless flat is clearly faster, as they spare the uplink, where
        bytes decide zen's own ties too; the paper's dense steps on a tie with sparse ones). The slowest
        rank's time is the call's length where the ranks start together (the step's end waits for it). The
        fastest call at the fastest rank (zen's BP-or-HC rule) is a lower bound, and a noisy one: one lucky call
        decides it, where the median of the slowest rank's calls needs most of them to agree."""
        if self.chosen is not None:
            return
        self.calls[mode] += 1
        if self.calls[mode] <= self.settle.get(mode, 0):
            return
        self.times[mode].append(seconds)
        if any(len(times) < TRIAL_CALLS for times in self.times.values()):
            return
        mine = torch.tensor([self.times[m][:TRIAL_CALLS] for m in CANDIDATES], dtype=torch.float64)
        table = comm.all_gather_fixed(mine.view(-1), dtype=torch.float64)
        slowest = torch.tensor(table, dtype=torch.float64).view(-1, len(CANDIDATES), TRIAL_CALLS).amax(0)
        typical = [statistics.median(row) for row in slowest.tolist()]
        self.chosen = next(m for m, t in zip(CANDIDATES, typical, strict=True) if t <= (1 + TIE) * min(typical))


def dist_node_comms(ranks_per_node: int, timeout_s: float | None = None, mode: str = "auto",
                    device: torch.device | None = None, seed: int | None = None) -> NodeComms:
    """Sub-groups of torch.distributed's default group, for payloads on `device`. `new_group` must be called by
    every rank for every group, so each rank creates all nodes' and all local ranks' groups in one order and
    keeps its two. `seed`: what the inter-node groups propose for their hash partitions (None: a random one)."""
    rank = dist.get_rank()
    timeout = group_timeout_for(timeout_seconds(timeout_s))  # Zen's deadline ends before the groups' watchdog
    mine = []
    for ranks in node_groups(dist.get_world_size(), ranks_per_node):
        group = dist.new_group(ranks, timeout=timeout)
        if rank in ranks:
            mine.append(group)
    intra, inter = mine
    return NodeComms(DistComm(intra, timeout_s, device=device), DistComm(inter, timeout_s, seed, device), mode)


def sim_node_comms(group: SimGroup, ranks_per_node: int, mode: str = "auto"
                   ) -> Callable[[int, torch.device], NodeComms]:
    """Sub-groups of a simulated group, made before its `run`; returns (rank, device) -> that rank's pair."""
    k = ranks_per_node
    subs = [group.subgroup(len(ranks)) for ranks in node_groups(group.world_size, k)]
    nodes = group.world_size // k

    def comms(rank: int, device: torch.device) -> NodeComms:
        return NodeComms(SimComm(subs[rank // k], rank % k, device), SimComm(subs[nodes + rank % k], rank // k, device),
                         mode)

    return comms


def scheme_settling(scheme: Scheme) -> Callable[[Communicator], int]:
    """The calls a scheme spends choosing its own path on a communicator (zen's trial; none for the others)."""
    return getattr(scheme, "settling_calls", lambda _: 0)


def settling_calls(scheme: Scheme, comm: Communicator, nodes: NodeComms | None = None) -> int:
    """Calls of one tensor size a sync of `scheme` over `comm` (two-level with `nodes`) spends choosing its
    path, the same on every rank: what a benchmark leaves untimed."""
    own = scheme_settling(scheme)
    return own(comm) if nodes is None else nodes.settling_calls(own, comm)


def interleaved_rows(rows: int, shards: int, j: int) -> int:
    """How many of `rows` rows shard j of `shards` interleaved ones holds (rows j, j + shards, ...)."""
    return max(rows - j + shards - 1, 0) // shards


class TwoLevel(Flat):
    """A scheme across nodes wrapped into two-level sync: what the synchronizer runs for embedding rows
    when ranks_per_node > 1. Its node steps send dense shards (`intra="dense"`, the rank's rows are not
    extracted first), the rank's non-zero rows (`"sparse"`, extracted as they are sent), or, `"auto"`, the
    fastest of those two and the scheme flat over all ranks for the tensor's size (`IntraTrial`). Its
    messages are bounded by the shards (`comm.announced`), not by the tensor's rows."""

    bounded_by_rows = False

    def __init__(self, inner: Scheme, nodes: NodeComms):
        super().__init__(inner)
        self.nodes = nodes

    @staticmethod
    def refuse(tensor: torch.Tensor, sparse_result: bool) -> None:
        """Two-level sync reduce-scatters dense shards: a COO gradient or result has none."""
        if tensor.layout != torch.strided or sparse_result:
            raise ZenInputError("zen: two-level sync (ranks_per_node > 1) takes dense tensors and gives a dense "
                                "result; sync a sparse COO gradient flat")

    def takes_rows(self, grad: LocalGrad, comm: Communicator) -> bool:
        """Whether this call sends the rank's non-zero rows (sparse node steps, or a sparse scheme flat): then
        they are extracted before the input check, whose NaN test reads those rows, not the dense tensor (a
        whole extra read of it)."""
        mode = self._trial(grad, comm).mode()
        return mode == "sparse" or (mode == "flat" and super().takes_rows(grad, comm))

    def _trial(self, grad: LocalGrad, comm: Communicator) -> IntraTrial:
        return self.nodes.steps_for(self.name, grad, comm, scheme_settling(self.inner))

    def __call__(self, grad: LocalGrad, comm: Communicator, out: Output, stats: SyncStats) -> None:
        assert isinstance(out, DenseOutput)
        trial = self._trial(grad, comm)
        mode = trial.mode()
        clock = Clock(grad.device).start() if trial.chosen is None else None  # timed only while on trial
        scheme = trial.scheme_for(mode, self.inner)
        if mode == "flat":
            scheme(grad, comm, out, stats)
        else:
            sync_two_level(scheme, grad, self.nodes, out, stats, mode, comm.announced(grad))
        stats.intra = mode
        if clock is not None:
            trial.record(mode, clock.stop().seconds(), comm)

    def predict(self, sets: list[torch.Tensor], layout: WireLayout) -> list[PhaseBytes]:
        return predict_two_level(self.inner, sets, layout, self.nodes.ranks_per_node, self.nodes.mode)


def sync_two_level(scheme: Scheme, grad: LocalGrad, comms: NodeComms, out: DenseOutput, stats: SyncStats,
                   mode: str, announced: list[int] | None = None) -> None:
    """The sum over every rank of `grad` (dense rows) into `out.buffer`, divided by `out.divisor`: reduce-
    scatter in the node, `scheme` across nodes on this rank's shard, then all-gather in the node. Dense node
    steps divide in the shard (1/k of the work), sparse ones while the gathered rows are written. `announced`:
    every rank's rows as the call's input check gave them (`Communicator.announced`), which bound the sparse
    steps' messages (`SparseBounds`)."""
    intra, inter = comms.intra, comms.inter
    intra.traffic, inter.traffic = stats.traffic.under(INTRA), stats.traffic.under(INTER)
    # every node's shards have rows (the same test on every rank): the shard groups share the node's uplink
    inter.shared_link = intra if grad.num_rows >= intra.world_size else None
    assert grad.dense is not None
    if mode == "sparse":
        limits = SparseBounds(announced, intra.world_size, inter.rank, grad.num_rows) if announced else None
        rows = sparse_reduce_scatter(grad, intra, limits.pushed if limits else None)
        # the same on every node: shard sizes depend only on the (checked) shape
        empty = not rows.num_rows
        if not empty and limits is not None:
            inter.announce(rows, limits.node_rows())
        sparse_all_gather(rows.rows() if empty else _sync_shard_rows(scheme, rows, inter, stats), intra, out,
                          limits.shard if limits else None)
    else:
        bounds = shard_bounds(grad.num_rows, intra.world_size)
        shard = reduce_scatter(grad, bounds, intra)
        if shard.shape[0]:
            shard = _sync_shard(scheme, shard, inter, out.divisor, stats)
        all_gather(shard, bounds, intra, out.buffer)
        out.divided = True


def all_gather(shard: torch.Tensor, bounds: list[int], intra: Communicator, out: torch.Tensor) -> None:
    """Every shard of the result from its local rank into `out` (dense rows)."""
    for j, (values,) in enumerate(intra.all_gather_v((shard,), phase="all_gather")):
        out[bounds[j] : bounds[j + 1]].copy_(values)


@dataclass(frozen=True)
class SparseBounds:
    """What the flat input check's row counts (every rank's, `announced`) bound in sparse node steps, for a rank
    on node `node` of nodes of k consecutive ranks: a local rank's push in the reduce-scatter (all its rows), a
    node's shard rows across nodes (all its ranks' rows), and a shard's result (its rows, and all rows)."""

    announced: list[int]
    k: int
    node: int
    num_rows: int

    def pushed(self, local: int) -> list[int]:
        return [self.announced[self.node * self.k + local]] * 2

    def node_rows(self) -> list[int]:
        return [sum(self.announced[q * self.k : (q + 1) * self.k]) for q in range(len(self.announced) // self.k)]

    def shard(self, local: int) -> list[int]:
        return [min(interleaved_rows(self.num_rows, self.k, local), sum(self.announced))] * 2


def sparse_all_gather(result: RowSet, intra: Communicator, out: DenseOutput,
                      bound: Callable[[int], list[int]] | None = None) -> None:
    """Every interleaved shard's result rows (int32 ids within the shard, and their undivided sums) from its
    local rank, written into `out` as disjoint row sets (rows id * k + j): one streaming pass that divides
    on the way (`DenseOutput.write_shards`), the same bits on every rank. `bound(j)`: local rank j's most rows."""
    ids, values = result
    out.write_shards(intra.all_gather_v((ids.to(torch.int32), values), phase="all_gather", bound=bound))


def sparse_reduce_scatter(grad: LocalGrad, intra: Communicator,
                          bound: Callable[[int], list[int]] | None = None) -> LocalGrad:
    """This rank's interleaved shard summed over its node, as rows: local rank j gets each rank's non-zero
    rows of shard j (int32 ids within the shard) and merges them in local-rank order. `bound(i)`: local rank
    i's most rows to one shard."""
    ids, values = grad.rows()
    k, j = intra.world_size, intra.rank
    wire = ids.to(torch.int32) if grad.num_rows < 2**31 else ids
    if (fast := native.split_interleaved(wire, values, k)) is not None:
        offsets, local, grouped = fast
        bounds = offsets.tolist()
        messages = [(local[lo:hi].to(torch.int32), grouped[lo:hi]) for lo, hi in zip(bounds, bounds[1:], strict=False)]
    else:
        owner, local = interleave(wire, k)
        messages = []
        for shard in range(k):
            mine = (owner == shard).nonzero().view(-1)
            messages.append((local.index_select(0, mine).to(torch.int32), values.index_select(0, mine)))
    parts = intra.all_to_all_v(messages, phase="reduce_scatter", bound=bound)
    shard_ids, shard_values = union_rows(parts, values, grad.row_width)
    return LocalGrad(interleaved_rows(grad.num_rows, k, j), grad.row_width, grad.dtype, grad.device,
                     indices=shard_ids.long(), values=shard_values)


def interleave(ids: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(shard, id within the shard) of every row id: (id % k, id // k), by bits where k is a power of two
    (the usual 2, 4, 8 ranks per node; an integer division is several times dearer)."""
    if k & (k - 1) == 0:
        return ids & (k - 1), ids >> (k.bit_length() - 1)
    local = ids // k
    return ids - local * k, local


def _sync_shard_rows(scheme: Scheme, grad: LocalGrad, inter: Communicator, stats: SyncStats) -> RowSet:
    """The node sums of one interleaved shard (rows) summed across nodes by `scheme`: the result's rows,
    undivided (the all-gather's write divides them)."""
    assert grad.values is not None
    out = RowsOutput((grad.num_rows, grad.row_width), 1, grad.values)
    scheme(grad, inter, out, stats)
    return out.rows(index_dtype=None)


def reduce_scatter(grad: LocalGrad, bounds: list[int], intra: Communicator) -> torch.Tensor:
    """This rank's shard summed over its node: shard j of every rank goes to local rank j (one
    all_to_all_v), which adds the k parts in local-rank order."""
    dense = grad.dense
    assert dense is not None
    parts = intra.all_to_all_v([(dense[lo:hi],) for lo, hi in zip(bounds, bounds[1:], strict=False)],
                               phase="reduce_scatter")
    total = parts[0][0].clone()
    for (part,) in parts[1:]:
        total += part
    return total


def _sync_shard(scheme: Scheme, shard: torch.Tensor, inter: Communicator, divisor: int,
                stats: SyncStats) -> torch.Tensor:
    """The node sums of one shard summed across nodes by `scheme`, in place in `shard` (rows: the shard's)."""
    grad = to_local_grad(shard, rows=True)
    if sends_rows(scheme):
        grad.rows()
    out = make_output(shard, grad, shard, divisor)
    scheme(grad, inter, out, stats)
    return out.finish()


# ---- bytes (zen.prediction) ---------------------------------------------------------------------
def predict_two_level(scheme: Scheme, sets: list[torch.Tensor], layout: WireLayout, ranks_per_node: int,
              intra: str = "auto") -> list[PhaseBytes]:
    """Per rank, per phase, the bytes of zen.twolevel (input check aside). Inside the node, dense (contiguous
    shards): the reduce-scatter brings k - 1 copies of the rank's shard, the all-gather the other shards,
    (k-1)/k of the tensor each when k divides it; sparse (interleaved shards): the other ranks' non-zero rows
    of the rank's shard, and every other shard's rows of the result (the union of all ranks' sets there), as
    COO rows. Across nodes: `scheme.predict` on each shard, over the nodes' sets there, the union of their
    ranks' sets (exact unless values cancel to zero); a scheme whose plan is chosen from the shard groups' bytes
    together where every shard has rows (zen's `predict_side_by_side`) predicts them at once. `intra="auto"`: dense,
    which it keeps where it cannot time the two (the simulated group); on real ranks its choice is in each call's
    `stats.intra`."""
    intra = "dense" if intra == "auto" else intra
    k, P = ranks_per_node, layout.world_size
    nodes = nodes_of(P, k)
    got: list[PhaseBytes] = [{} for _ in range(P)]
    union = int(torch.unique(torch.cat(sets)).numel()) if intra == "sparse" else 0
    shards = [_shard(sets, layout.rows, k, j, intra) for j in range(k)]
    groups = [([torch.unique(torch.cat(local[n * k : (n + 1) * k])) for n in range(nodes)],
               replace(layout, world_size=nodes, rows=rows, index_bytes=4 if rows < 2**31 else 8))
              for local, rows in shards]
    side_by_side = getattr(scheme, "predict_side_by_side", None)
    if side_by_side is not None and layout.rows >= k:  # every shard group syncs rows: they choose together
        inter = side_by_side(groups)
    else:
        inter = [scheme.predict(*group) if rows else [{} for _ in range(nodes)]
                 for group, (_, rows) in zip(groups, shards, strict=True)]
    for j, ((local, rows), across) in enumerate(zip(shards, inter, strict=True)):
        elsewhere = union - int(torch.unique(torch.cat(local)).numel()) if intra == "sparse" else 0
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
            INTRA + "meta": count_meta(k) + gather_v_meta(k)}


def _intra_sparse(layout: WireLayout, local: list[torch.Tensor], elsewhere: int, n: int, j: int, k: int
                  ) -> PhaseBytes:
    """Local rank j of node n: its node peers' rows in shard j (`local`: every rank's set there), and the
    result's rows in every other shard (`elsewhere`: the union of all ranks' sets outside shard j)."""
    row = 4 + layout.width * layout.value_bytes  # int32 id within the shard, then the row
    pushed = sum(int(local[n * k + i].numel()) for i in range(k) if i != j)
    return {INTRA + "reduce_scatter": pushed * row, INTRA + "all_gather": elsewhere * row,
            INTRA + "meta": count_meta(k) + gather_v_meta(k)}
