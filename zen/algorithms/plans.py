"""`zen`'s plans and their predicted times, from what every rank knows once BP has run (zen.algorithms.selector).

After the measuring BP calls every rank has all-gathered, per rank: its non-zero rows, what it pushed to each hash
server, how many non-zero rows it served, and how many of its rows fall in each of n equal ranges (`Counts`). That
gives BP's bytes exactly, per rank, sent and received (a server sends its pull message to n - 1 ranks, so the
busiest server decides, not the mean), the all-gather's exactly, and BP over ranges' push exactly; its pull comes
from the result's non-zero rows in each range, which every rank counts on the same result. HC's bytes come from the
cost model's closed form at the measured gamma, its gap codes scaled by what the ranks' own codes measured against
random sets'. A plan's time is its busiest rank's bytes, sent or received (its messages' headers included), over the
link's rate, plus its hops' latency (the exchanges one after another: BP's all-to-alls reach every peer at once, a
ring all-gather takes n - 1 steps, HC two hops a round), plus its slowest rank's local work (rows walked by its
merges, decodes and sums, their value bytes, its steps) at the prices measured on this machine
(zen.algorithms.localcost). Two-level sync's shard groups share each node's link: predicted together, their bytes
add up per node (`predicted_times` of a list of `Counts`), and where BP is their plan each group takes the
partitioning, hashes or ranges, that shortens their time together (`partitions_side_by_side`).

The plans (`PLANS`): "bp" (hash partitions), "bp-range" (equal ranges), "hc" / "hc-coo" (HC with gap-coded or
plain ids), "ag" / "ag-coo" (HC without its merge: one all-gather), "allreduce" (the dense ring all-reduce: where
every rank's rows are near-dense no sparse plan beats it, as ids cost bytes and the union saves none).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from zen import costmodel, gaps
from zen.algorithms.bp import BITS_SERVERS, BalancedParallelism
from zen.algorithms.localcost import LocalCost
from zen.algorithms.partitions import even_bounds
from zen.comm.base import count_meta, gather_v_meta, message_meta, ring_chunk
from zen.fold import Fold
from zen.types import WireLayout

PLANS = ("bp", "bp-range", "hc", "hc-coo", "ag", "ag-coo", "allreduce")
TIE = 0.05  # predicted or timed differences within this fraction count as a tie
RANGE_MARGIN = 0.01  # ranges (or the dense all-reduce) replace the measured plans only when predicted this much faster


@dataclass(frozen=True)
class Counts:
    """Per rank i: nnz[i] non-zero rows; hash_push[i][j] of them owned by hash server j; served[i] non-zero rows
    of the partition rank i served; coded[i] bytes of its ids gap-coded (zen.gaps); range_push[i][j] of its rows
    in range j. `owned[j]`: |S_j| of the hash partitions; `range_union[j]`: the result's non-zero rows in range j
    (every rank reads them off the same result)."""

    layout: WireLayout
    nnz: list[int]
    hash_push: list[list[int]]
    served: list[int]
    coded: list[int]
    range_push: list[list[int]]
    owned: list[int]
    range_union: list[int]

    @staticmethod
    def row_length(n: int) -> int:
        """Numbers a rank's flat row holds (what the selector all-gathers and `from_rows` reads): nnz, served,
        coded, its n hash pushes and its n range pushes; anything after them is the caller's."""
        return 3 + 2 * n

    @classmethod
    def from_rows(cls, layout: WireLayout, rows: list[list[int]], owned: list[int], range_union: list[int]
                  ) -> Counts:
        n = layout.world_size
        return cls(layout, [r[0] for r in rows], [list(r[3 : 3 + n]) for r in rows], [r[1] for r in rows],
                   [r[2] for r in rows], [list(r[3 + n : 3 + 2 * n]) for r in rows], owned, range_union)

    @property
    def union(self) -> int:
        return sum(self.served)


@dataclass(frozen=True)
class Load:
    """A plan's cost on each rank: per phase the bytes each rank sends and receives, the hops one after another on
    its path (each costs the link's latency: an exchange with many peers at once is one hop, a ring's n - 1 steps
    are n - 1), and each rank's local work (rows walked, their value bytes, steps)."""

    phases: list[tuple[list[float], list[float]]]
    hops: int
    work: list[tuple[float, float, float]]

    def __add__(self, other: Load) -> Load:
        """Two groups side by side on the same nodes (rank r of each on node r): their bytes share the node's link,
        their messages overlap, and each group's local work runs on its own rank."""
        phases = [([a + b for a, b in zip(s1, s2, strict=True)], [a + b for a, b in zip(r1, r2, strict=True)])
                  for (s1, r1), (s2, r2) in zip(self.phases, other.phases, strict=True)]
        return Load(phases, max(self.hops, other.hops), self.work + other.work)

    def busy_bytes(self) -> float:
        """The bytes that set the pace: per phase its busiest rank's, sent or received."""
        return sum(max(max(s, r) for s, r in zip(sent, got, strict=True)) for sent, got in self.phases)

    def seconds(self, net: costmodel.Network, local: LocalCost) -> float:
        """Each phase as long as its busiest rank's bytes, the hops' latency, and the slowest rank's local work."""
        return self.hops * net.alpha + self.busy_bytes() / net.bandwidth + self.local_seconds(local)

    def local_seconds(self, local: LocalCost) -> float:
        return max(local.seconds(*w) for w in self.work)


def _bp_load(c: Counts, push: list[list[int]], owned: list[int], union: list[float], bp: BalancedParallelism,
             hashed: bool) -> Load:
    """Push then pull; each rank groups its rows (hashed: a pass over them), sums what it was pushed, encodes
    what it serves and decodes every partition of the union (three steps, the kernels taking all partitions at once,
    and a step per message),
    reading every server's membership words where it keeps them (bp.BITS_SERVERS), else the pulled bitmaps."""
    n, layout = c.layout.world_size, c.layout
    sent = [sum(push[r][j] for j in range(n) if j != r) * layout.coo_row for r in range(n)]
    got = [sum(push[i][r] for i in range(n) if i != r) * layout.coo_row for r in range(n)]
    payload = [float(bp.encoding.payload_bytes(owned[j], round(union[j]), layout)) for j in range(n)]
    meta = [float(count_meta(n) + gather_v_meta(n))] * n
    pulls = ([(n - 1) * p for p in payload], [sum(payload) - p for p in payload])
    rows = [(c.nnz[r] if hashed else 0) + sum(push[i][r] for i in range(n)) + union[r] + sum(union)
            for r in range(n)]
    words = n * layout.rows / 8 if n <= BITS_SERVERS else sum(payload) - sum(union) * layout.width * layout.value_bytes
    # hops: the counts' and the push's exchanges, the pull's sizes all-gathered (a ring: n - 1 steps), the pull
    return Load([(sent, got), pulls, (meta, meta)], n + 2,
                [(x, x * layout.width * layout.value_bytes + words, 3 + 2 * (n - 1)) for x in rows])


def _work(rows: float, layout: WireLayout, steps: float) -> tuple[float, float, float]:
    return rows, rows * layout.width * layout.value_bytes, steps


def _allreduce_load(layout: WireLayout) -> Load:
    """The ring all-reduce's bytes (its reduce-scatter's and all-gather's chunks, zen.comm.base.ring_chunk) on
    2 (n - 1) hops; local work by bytes alone (a dense pass has no row ids to walk): the buffer zeroed, the
    reduce-scatter's chunks added and the all-gather's copied in, a step each."""
    n, numel = layout.world_size, layout.rows * layout.width
    each = [2.0 * (numel - ring_chunk(numel, n, r)) * layout.value_bytes for r in range(n)]
    work = (0.0, float(numel * layout.value_bytes) + max(each), 2 * (n - 1))
    return Load([(each, each)], 2 * (n - 1), [work] * n)


def loads(c: Counts, plans: Mapping[str, Any]) -> dict[str, Load]:
    """Every plan's `Load` (see the module's docstring); `plans`: the scheme running each plan."""
    n, layout = c.layout.world_size, c.layout
    out = {"bp": _bp_load(c, c.hash_push, c.owned, [float(s) for s in c.served], plans["bp"], True)}
    bounds = even_bounds(layout.rows, n)
    out["bp-range"] = _bp_load(c, c.range_push, [bounds[j + 1] - bounds[j] for j in range(n)],
                               [float(u) for u in c.range_union], plans["bp-range"], False)
    mean = sum(c.nnz) / n
    w = costmodel.Sparsity(n=n, rows=layout.rows, density=mean / layout.rows,
                           gamma=costmodel.gamma_from_union(n, c.union / mean), width=layout.width,
                           value_bytes=layout.value_bytes, index_bytes=layout.index_bytes)
    expected = sum(k * gaps.bytes_per_id(k / layout.rows) for k in c.nnz)
    scale = sum(c.coded) / expected if expected else 1.0  # clustered rows code shorter than random ones
    fold = Fold(n)
    walked = sum(4 * w.gamma(1 << i) * w.nnz for i in range(fold.levels))  # a round: code, decode, merge two sets
    steps = 4 * (fold.levels + (2 if fold.extra else 0))  # a round's code, decode, merge and message
    for name in ("hc", "hc-coo"):
        form = plans[name].closed_form(w, scale)
        each = [form.bytes_received + form.messages * message_meta()] * n
        out[name] = Load([(each, each)], steps // 2, [_work(walked, layout, steps)] * n)  # hops: a round's counts,
        # then its rows, the fold's in and out rounds included (the folded ranks wait for both)
    for name in ("ag", "ag-coo") if n > 2 else ():  # HC of two ranks is one exchange and no merge already
        values = layout.width * layout.value_bytes
        sizes = [k * (values + layout.index_bytes) for k in c.nnz] if name == "ag-coo" else \
            [k * values + coded for k, coded in zip(c.nnz, c.coded, strict=True)]
        meta = [float(gather_v_meta(n))] * n
        rows = [2 * sum(c.nnz) - k for k in c.nnz]  # decode the others' sets, sum every set into the result
        out[name] = Load([([(n - 1) * b for b in sizes], [sum(sizes) - b for b in sizes]), (meta, meta)], n,
                         [_work(x, layout, 2 * n) for x in rows])  # hops: the sizes' ring, the rows; a message
        # and its decode per rank, one sum
    out["allreduce"] = _allreduce_load(layout)
    return out


def predicted_times(c: Counts | list[Counts], net: costmodel.Network, plans: Mapping[str, Any],
                    local: LocalCost | None = None) -> dict[str, float]:
    """Every plan's predicted seconds: its busiest rank's bytes over the link's rate, its messages' latency and its
    slowest rank's local work at `local`'s prices (none: bytes only). A list of `Counts`: groups side by side
    whose rank r share node r's link (two-level sync's shard groups): their bytes add up per node."""
    total = side_by_side(c, plans)
    if total is None:
        return {name: 0.0 for name in ("bp", "bp-range", "hc", "hc-coo", "allreduce")}
    return {name: load.seconds(net, local or LocalCost()) for name, load in total.items()}


def side_by_side(c: Counts | list[Counts], plans: Mapping[str, Any]) -> dict[str, Load] | None:
    """Every plan's `Load` of groups side by side (a list of `Counts`, rank r of each on node r): their bytes added
    per node; None where no group has rows or there is one rank (nothing crosses a link)."""
    groups = [g for g in (c if isinstance(c, list) else [c]) if any(g.nnz)]  # a group without rows: headers only
    if not groups or groups[0].layout.world_size == 1:
        return None
    each = [loads(g, plans) for g in groups]
    return {name: sum((e[name] for e in each[1:]), each[0][name]) for name in each[0]}


def partitions_side_by_side(groups: list[Counts], net: costmodel.Network, plans: Mapping[str, Any],
                            local: LocalCost | None, times: dict[str, float], ids: str = "gaps"
                            ) -> tuple[list[str], dict[str, float]]:
    """BP's partitioning for each of `groups` side by side (two-level sync's shard groups), chosen together, and
    `times` with BP's (`families`' pick) at that mix. From `families`' pick for all, each group in turn, twice over,
    takes the other partitioning where that shortens the groups' predicted time: shard groups of a skewed tensor
    differ (one whose rows crowd a few ranges is balanced by hashes, one whose union is near-dense by ranges), and
    both partitionings run BP's phases, so the groups still move in step. The same numbers give the same mix on
    every rank; a group without rows keeps the pick."""
    bp = families(times, ids)[0]
    mix = [bp] * len(groups)
    live = [j for j, g in enumerate(groups) if any(g.nnz)]
    if len(live) < 2 or groups[0].layout.world_size == 1:
        return mix, times
    each = {j: loads(groups[j], plans) for j in live}
    other = {"bp": "bp-range", "bp-range": "bp"}

    def seconds(m: list[str]) -> float:
        total = each[live[0]][m[live[0]]]
        for j in live[1:]:
            total = total + each[j][m[j]]
        return total.seconds(net, local or LocalCost())

    best = seconds(mix)
    for _ in range(2):
        for j in live:
            trial = [other[m] if i == j else m for i, m in enumerate(mix)]
            if (t := seconds(trial)) < best:
                mix, best = trial, t
    return mix, {**times, bp: best}


def choose_side_by_side(groups: list[Counts], net: costmodel.Network, plans: Mapping[str, Any],
                        local: LocalCost | None = None, ids: str = "gaps") -> list[str]:
    """Each group's plan, chosen together where nothing is timed: `best` of the groups' times with BP's at its mix
    (`partitions_side_by_side`); where that is BP, the mix, else one plan for all."""
    times = predicted_times(groups, net, plans, local)
    mix, times = partitions_side_by_side(groups, net, plans, local, times, ids)
    choice = best(times, ids)
    return mix if choice == families(times, ids)[0] else [choice] * len(groups)


def counts_of(sets: list[torch.Tensor], layout: WireLayout, seed: int, bp: BalancedParallelism) -> Counts:
    """The `Counts` the ranks would all-gather after a BP call on these row sets (`predict`'s steady state)."""
    n, M = layout.world_size, layout.rows
    hashed = bp.partitioner(lambda: seed)
    union = torch.unique(torch.cat(sets))
    served = torch.bincount(hashed.owners(union, n, M), minlength=n).tolist()
    _, offsets = hashed.server_rows(M, n, torch.device("cpu"))
    ranges = torch.tensor(even_bounds(M, n), dtype=torch.int64)
    return Counts(layout, [int(s.numel()) for s in sets],
                  [torch.bincount(hashed.owners(s, n, M), minlength=n).tolist() for s in sets], served,
                  [gaps.nbytes(s) for s in sets],
                  [torch.searchsorted(s.to(torch.int64), ranges).diff().tolist() for s in sets],
                  [offsets[j + 1] - offsets[j] for j in range(n)], torch.searchsorted(union, ranges).diff().tolist())


def measured_link(c: Counts | list[Counts], bp_s: float, net: costmodel.Network, plans: Mapping[str, Any],
                  local: LocalCost) -> costmodel.Network:
    """`net` with the link's rate as a BP call of `bp_s` seconds measured it: BP's busiest bytes over the part of
    the call its local work and latency do not explain (at least a tenth of the call: the local cost is a model).
    Where bytes are nearly free (ranks sharing cores on loopback) local work then decides, where the link is slow
    bytes do. A list of `Counts`: groups side by side, whose BP calls shared each node's link for `bp_s`."""
    total = side_by_side(c, plans)
    if total is None:
        return net
    load = total["bp"]
    wire = max(bp_s - load.local_seconds(local) - load.hops * net.alpha, 0.1 * bp_s)
    return costmodel.Network(net.alpha, load.busy_bytes() / wire) if load.busy_bytes() > 0 else net


def families(times: dict[str, float], ids: str = "gaps") -> tuple[str, str]:
    """(BP's plan, HC's plan) to weigh against each other: BP over hash partitions, or over ranges where those
    are predicted faster by RANGE_MARGIN; HC, or its all-gather where that is predicted faster: HC's rounds save
    bytes only where ranks share rows, and the all-gather skips its merges, which the prediction prices (no margin
    on top: one made the all-gather win where HC's saved bytes were worth more than its merges). `ids`: "gaps" or
    "coo"."""
    bp = "bp-range" if times["bp-range"] < (1 - RANGE_MARGIN) * times["bp"] else "bp"
    hc = "ag" if "ag" in times and times["ag"] < times["hc"] else "hc"
    return bp, hc if ids == "gaps" else f"{hc}-coo"


def close_families(times: dict[str, float]) -> bool:
    """Whether HC and its all-gather are predicted within TIE of each other (gap-coded ids; none at 2 ranks)."""
    return "ag" in times and abs(times["ag"] - times["hc"]) <= TIE * max(times["ag"], times["hc"])


def best(times: dict[str, float], ids: str = "gaps") -> str:
    """The predicted choice: the faster of `families`' two (BP on a tie), or the dense all-reduce where that is
    predicted faster than both by RANGE_MARGIN."""
    return "allreduce" if dense_wins(times, ids) else fastest_sparse(times, ids)


def fastest_sparse(times: dict[str, float], ids: str = "gaps") -> str:
    """The faster of `families`' two, BP on a tie."""
    bp, hc = families(times, ids)
    return hc if times[hc] < times[bp] else bp


def dense_wins(times: dict[str, float], ids: str = "gaps") -> bool:
    """Whether the dense all-reduce is predicted faster than the fastest sparse plan by RANGE_MARGIN."""
    return "allreduce" in times and times["allreduce"] < (1 - RANGE_MARGIN) * times[fastest_sparse(times, ids)]
