"""The `zen` scheme: run Balanced Parallelism while measuring, then pick one of zen's plans for each tensor size
(paper section 5, Theorem 1, widened to the plans of zen.algorithms.plans).

The plans: BP over hash partitions or over equal ranges, HC with gap-coded or plain ids, HC without its merge
(one all-gather) with either, and the dense all-reduce. After the measuring BP calls every rank all-gathers what
it knows (its rows, its push and serve counts, its ids' gap-coded size, its rows per range:
zen.algorithms.plans.Counts), and every
rank predicts each plan's time from those counts, the busiest rank's bytes over the link's rate plus its
messages' latency plus its local work (zen.algorithms.localcost); on a real backend the link's rate is the one BP's
measuring calls saw (`plans.measured_link`), so local work decides where bytes are nearly free. Two-level sync's
shard groups share their node's uplink: there the node's ranks also all-gather their groups' counts inside the node
and predict the groups together (`groups_on_link`), as the step simulator does: one plan, and where that is BP, each
group's partitioning in the mix that is fastest together (`plans.partitions_side_by_side`). Which BP
(hash or ranges) and which HC (HC, or its all-gather where predicted faster) are settled by that
prediction (`plans.families`), unless HC and its all-gather are predicted within TIE of each other: then the trial
times both (below); on a simulated group, whose clock means nothing, the prediction alone decides, BP against HC
too. The dense all-reduce is taken where predicted faster than the sparse plans (`plans.best`); on a real backend
the trial times it first (its algorithm there is the backend's, not the ring the prediction prices).

Bytes are the verdict where the network is the bottleneck; where local work competes (ranks sharing cores, a slow
decode of many partitions) they can mislead: BP can move fewer bytes than HC and still take longer, as its decode of
P partitions competes with the other ranks for the cores. So by default (`select="time"`) on real backends the HC
side is also timed: after the measuring BP calls, `trial_iters` calls of each of its id encodings run (where HC and
its all-gather are predicted close, both plans in each encoding, as many calls in all: the prediction leaves out a
round's fixed cost, which decides between HC's log2(n) rounds and one all-gather on a fast link), each rank
all-gathers the fastest of each, and the one slower at its fastest rank loses; within TIE the prediction decides.
With `hc_ids="auto"` (the default) both encodings are timed and plain COO ids are kept only where faster by more
than TIE, so where bytes are nearly free (ranks sharing cores on loopback) HC does not pay for a coding it does not
need. The fastest of several calls where the budget allows, not one call each: a call that met a busy core (a DDP
hook's call overlaps backward) would otherwise settle the choice for good. The fastest rank, not the slowest: a
rank's time includes waiting for the others to arrive (in a DDP hook, how far apart the ranks' backward passes are),
which no path changes; the rank that arrived last waited least, so its time is the path's own, which is what a
step's end waits for after the last rank is ready. On a GPU the calls are timed with CUDA events on the lane's
stream (zen.device.Clock), not the host's clock, which would see only the time to enqueue them.
"""

from __future__ import annotations

import torch

from zen import costmodel, gaps
from zen.algorithms import plans
from zen.algorithms.allreduce import DenseAllReduce
from zen.algorithms.bp import BalancedParallelism
from zen.algorithms.gather import GatherRows
from zen.algorithms.hc import HierarchicalCentralization
from zen.algorithms.localcost import LocalCost
from zen.algorithms.partitions import even_bounds
from zen.comm.base import Communicator
from zen.device import Clock
from zen.encodings import nonzero_rows
from zen.grad import LocalGrad
from zen.output import DenseOutput, Output, RowsOutput
from zen.registry import register_scheme
from zen.types import PhaseBytes, SyncStats, WireLayout

SELECT = ("time", "bytes")
HC_IDS = ("auto", "gaps", "coo")
TIE = plans.TIE
Scheme = BalancedParallelism | HierarchicalCentralization | GatherRows | DenseAllReduce


@register_scheme("zen")
class ZenAuto:
    """Measures during the first `measure_iters` calls per tensor size (as BP), then, with `select="time"` on a
    real backend, times `trial_iters` calls of each HC encoding; keeps the choice. More calls choose more surely
    where the variants are close (two calls' fastest can pick the slower of two encodings a few percent apart, as
    call times on shared cores vary more than that), but every call of the trial is one a short benchmark times:
    the training cells time steps 4-12, so the default stays at two. Every rank decides from the same all-gathered
    numbers. `hc_ids`: how HC's (and its all-gather's) messages carry their ids, "gaps" (zen.gaps: a compressed
    part's rows cost 5 bytes, not 8), "coo" (the paper's) or "auto" (both timed on a real backend; gaps where
    nothing is timed, as in the simulated group). `choice` fixes a plan (plans.PLANS). `local_cost`: the prediction
    prices each plan's local work at the constants measured here (zen.algorithms.localcost), else bytes only."""

    sparse_input = True
    label = "Zen"
    color = "#d62728"
    marker = "o"

    def __init__(self, measure_iters: int = 2, alpha: float = 0.0, bandwidth_gbps: float = 25.0,
                 choice: str | None = None, select: str = "time", hc_ids: str = "auto", trial_iters: int = 2,
                 local_cost: bool = True, **bp_options: object):
        if choice is not None and choice not in plans.PLANS:
            raise ValueError(f"choice must be one of {plans.PLANS} or None (auto), got {choice!r}")
        if select not in SELECT:
            raise ValueError(f"select must be one of {SELECT}, got {select!r}")
        if hc_ids not in HC_IDS:
            raise ValueError(f"hc_ids must be one of {HC_IDS}, got {hc_ids!r}")
        self.bp = BalancedParallelism(**bp_options)  # type: ignore[arg-type]
        self.bp_range = BalancedParallelism(**{**bp_options, "partitions": "range"})  # type: ignore[arg-type]
        fixed = "coo" if hc_ids == "coo" else "gaps"
        self.hc, self.ag = HierarchicalCentralization(ids=fixed), GatherRows(ids=fixed)
        self.hc_coo, self.ag_coo = HierarchicalCentralization(ids="coo"), GatherRows(ids="coo")
        self.allreduce = DenseAllReduce()
        self.hc_ids = hc_ids
        self.measure_iters = max(1, measure_iters)
        self.trial_iters = max(1, trial_iters)
        self.net = costmodel.Network(alpha=alpha, bandwidth=bandwidth_gbps * 1e9 / 8)
        self.local = LocalCost.default() if local_cost else LocalCost()
        self.forced = choice
        self.select = select
        self.measured: dict[tuple, list[float]] = {}  # key -> the measuring BP calls' times
        self.trials: dict[tuple, tuple[float, str, str, dict[str, list[float]], int]] = {}  # key -> (BP's
        # fastest, the predicted sparse choice, BP's plan, each timed plan's call times so far, calls each)
        self.choices: dict[tuple, str] = {}  # key -> a plan of plans.PLANS

    def plan(self, name: str) -> Scheme:
        """The scheme that runs plan `name` (looked up per call, so a test may wrap one)."""
        return getattr(self, name.replace("-", "_"))

    def __call__(self, grad: LocalGrad, comm: Communicator, out: Output, stats: SyncStats) -> None:
        key = (grad.num_rows, grad.row_width, grad.dtype)
        choice = self.forced or self.choices.get(key)
        if choice is None and key in self.trials:
            self._trial(key, grad, comm, out, stats)
            return
        if choice is not None and choice != "bp":
            stats.choice = choice
            self.plan(choice)(grad, comm, out, stats)
            return
        clock = Clock(grad.device).start()
        self.bp(grad, comm, out, stats)
        stats.choice = "bp"
        if choice is None:
            times = self.measured.setdefault(key, [])
            times.append(clock.stop().seconds())
            if len(times) >= self.measure_iters:
                ids = "coo" if self.hc_ids == "coo" else "gaps"
                predicted, bp_plan = self._predict(grad, comm, out, stats, min(times), ids)
                family, hc_plan = plans.families(predicted, ids)
                if self.select == "time" and comm.clocked and comm.world_size > 1:
                    timed, each = self._trial_plans(predicted, hc_plan, plans.dense_wins(predicted, ids))
                    self.trials[key] = (min(times), plans.fastest_sparse(predicted, ids), bp_plan,
                                        {v: [] for v in timed}, each)
                else:
                    choice = plans.best(predicted, ids)
                    self.choices[key] = bp_plan if choice == family else choice

    def settling_calls(self, comm: Communicator) -> int:
        """Calls per tensor size spent choosing a plan on `comm` (the measuring BP calls, then each timed HC
        encoding's), the same on every rank: what a trial around zen (two-level's node steps) does not time."""
        if self.forced:
            return 0
        timed = self.select == "time" and comm.clocked and comm.world_size > 1
        return self.measure_iters + (self._trial_budget() if timed else 0)

    def _trial_budget(self) -> int:
        """The trial's calls: `trial_iters` for each of HC's id encodings timed."""
        return self.trial_iters * len(self._suffixes())

    def _suffixes(self) -> tuple[str, ...]:
        """The id encodings timed, as plan-name suffixes: gaps (none) and plain COO with `hc_ids="auto"`."""
        return {"auto": ("", "-coo"), "gaps": ("",), "coo": ("-coo",)}[self.hc_ids]

    def _trial_plans(self, predicted: dict[str, float], hc_plan: str, dense: bool = False
                     ) -> tuple[tuple[str, ...], int]:
        """The plans the trial times besides BP, and the calls each: HC's plan (HC, or its all-gather, as
        predicted) in each id encoding timed. Where HC and its all-gather are predicted within TIE of each other,
        both, in as many calls in all (fewer each): the prediction prices bytes and local work but not a round's
        fixed cost, which on a fast link or shared cores can decide between log2(n) merge rounds and one
        all-gather. Where the dense all-reduce is predicted fastest (`dense`), it is timed too, in as many calls
        in all: beside those where a call is to spare, else beside HC's plan as predicted alone (with a budget of one
        call, against BP alone); the backends' all-reduce algorithms are not the ring the prediction prices."""
        budget = self._trial_budget()
        base = hc_plan.removesuffix("-coo")
        bases = [base]
        if plans.close_families(predicted) and 2 * len(self._suffixes()) <= budget - dense:
            bases.append("ag" if base == "hc" else "hc")
        timed = tuple(b + suffix for b in bases for suffix in self._suffixes())
        if dense and len(timed) < budget:
            timed = (*timed, "allreduce")
        elif dense:
            timed = (hc_plan, "allreduce") if budget >= 2 else ("allreduce",)
        return timed, budget // len(timed)

    def _trial(self, key: tuple, grad: LocalGrad, comm: Communicator, out: Output, stats: SyncStats) -> None:
        """One timed call of a plan of `_trial_plans` (in order); after each has had its calls, the choice:
        per plan its fastest call at the rank where it is fastest (the one that waited least for the others);
        per HC plan plain COO ids over gaps only when faster by more than TIE; HC against its all-gather where both
        were timed, the faster (the prediction's on a tie); then BP's plan against that (BP's measured calls
        standing for either partitioning), the prediction on a tie; then, where timed, the dense all-reduce
        against the winner, the all-reduce (predicted fastest) on a tie."""
        bp_s, predicted, bp_plan, hc_times, each = self.trials[key]
        variant = next(v for v, times in hc_times.items() if len(times) < each)
        clock = Clock(grad.device).start()
        self.plan(variant)(grad, comm, out, stats)
        stats.choice = variant
        hc_times[variant].append(clock.stop().seconds())
        if any(len(times) < each for times in hc_times.values()):
            return
        del self.trials[key]
        mine = [bp_s] + [min(times) for times in hc_times.values()]
        table = comm.all_gather_fixed(torch.tensor(mine, dtype=torch.float64), dtype=torch.float64)
        bp_best, *fastest = (min(column) for column in zip(*table, strict=True))
        timed = dict(zip(hc_times, fastest, strict=True))
        dense_s = timed.pop("allreduce", None)
        stats.extra["bp_trial_s"] = bp_best
        choice = (bp_plan, bp_best)
        if timed:
            hc = hc_verdict(timed)
            stats.extra["hc_trial_s"] = hc[1]
            choice = _faster(choice, hc, first=predicted.startswith("bp"))
        if dense_s is not None:  # timed only where predicted fastest
            stats.extra["dense_trial_s"] = dense_s
            choice = _faster(("allreduce", dense_s), choice, first=True)
        self.choices[key] = choice[0]

    def _predict(self, grad: LocalGrad, comm: Communicator, out: Output, stats: SyncStats, bp_s: float, ids: str
                 ) -> tuple[dict[str, float], str]:
        """Every plan's predicted time from the counts every rank all-gathers after a BP call, and the BP call's
        result, and this rank's BP partitioning: `families`' pick, or where shard groups share the link, its group's
        in the mix they take together (`plans.partitions_side_by_side`, whose time BP's then is). On a clock that
        means something, the link's rate is the one BP's fastest call measured (at the rank where it was fastest, as
        the trial reads its calls: `plans.measured_link`), else `bandwidth_gbps`."""
        n, M = comm.world_size, grad.num_rows
        length = plans.Counts.row_length(n)  # then BP's call time, ns
        layout = WireLayout(n, M, grad.row_width, grad.dtype.itemsize, grad.index_dtype().itemsize)
        ids = grad.rows()[0]
        ranges = torch.tensor(even_bounds(M, n), dtype=ids.dtype, device=ids.device)
        pushed = stats.push_counts if stats.push_counts is not None else [0] * n
        head = [stats.nnz, stats.server_count or 0, gaps.nbytes(ids)]
        mine = torch.cat([torch.tensor(head, device=ids.device),
                          torch.as_tensor(pushed, device=ids.device).to(torch.int64).view(-1),
                          torch.searchsorted(ids, ranges).diff().to(torch.int64),
                          torch.tensor([round(bp_s * 1e9)], device=ids.device)])
        if n == 1:
            rows = [mine.tolist()]
        else:
            gathered = comm.all_gather_v((mine,), phase="meta", bound=lambda j: [length + 1])
            rows = [message[0].tolist() for message in gathered]
        _, offsets = self.bp.partitioner(comm.shared_seed).server_rows(M, n, grad.device)
        owned = [offsets[j + 1] - offsets[j] for j in range(n)]
        counts = plans.Counts.from_rows(layout, rows, owned, range_rows(out, ranges))
        union, mean = counts.union, sum(counts.nnz) / n
        stats.extra["gamma_n"] = union / mean if mean else 1.0
        groups, bp_s = [counts], min(r[length] for r in rows) / 1e9
        if n > 1 and comm.shared_link is not None:
            groups, bp_s = groups_on_link(comm.shared_link, counts, rows, ids.device)
        net = self.net
        if comm.clocked and n > 1 and any(g.union for g in groups):
            net = plans.measured_link(groups, bp_s, net, self._plans(), self.local)
            stats.extra["link_gbps"] = 8 * net.bandwidth / 1e9
        times = plans.predicted_times(groups, net, self._plans(), self.local)
        mix, times = plans.partitions_side_by_side(groups, net, self._plans(), self.local, times, ids)
        return times, mix[comm.shared_link.rank if len(groups) > 1 else 0]

    def _plans(self) -> dict[str, Scheme]:
        return {name: self.plan(name) for name in plans.PLANS}
    def choose(self, w: costmodel.Sparsity) -> str:
        """The closed forms' rule (Theorem 1), where only the statistics are known (the cluster model): whichever
        of BP and HC the cost model has finish first."""
        return "bp" if self.bp.closed_form(w).time(self.net) <= self.hc.closed_form(w).time(self.net) else "hc"

    def closed_form(self, w: costmodel.Sparsity) -> costmodel.Prediction:
        """The closed form of the path it picks for `w` (or the plan it was told to take)."""
        return self.plan(self.forced or self.choose(w)).closed_form(w)

    def predict(self, sets: list[torch.Tensor], layout: WireLayout) -> list[PhaseBytes]:
        """Steady state: the plan the selector predicts fastest from the counts these sets give (as the ranks
        all-gather them after a BP call; a timed trial may pick HC's other id encoding, which this cannot know)."""
        return self.predict_side_by_side([(sets, layout)])[0]

    def predict_side_by_side(self, groups: list[tuple[list[torch.Tensor], WireLayout]]) -> list[list[PhaseBytes]]:
        """`predict` of groups side by side on the same nodes (two-level sync's shard groups, every one with rows
        to sync): one plan, predicted from all groups' counts together, as their ranks choose it, and where that is
        BP, each group's partitioning in the mix they take together."""
        chosen = [self.forced] * len(groups)
        if self.forced is None:
            counts = [plans.counts_of(sets, layout, layout.seed, self.bp) for sets, layout in groups]
            chosen = plans.choose_side_by_side(counts, self.net, self._plans(), self.local,
                                               "coo" if self.hc_ids == "coo" else "gaps")
        return [self.plan(c).predict(sets, layout) for c, (sets, layout) in zip(chosen, groups, strict=True)]


def groups_on_link(link: Communicator, counts: plans.Counts, rows: list[list[int]], device: torch.device
                 ) -> tuple[list[plans.Counts], float]:
    """Every group's `Counts` sharing this rank's link (`link`: one rank of each group, two-level sync's node), in
    `link`'s rank order, and the slowest group's BP time at its fastest rank: one all-gather of what this rank's
    group all-gathered (its rows of `Counts.row_length` numbers and BP's time, its tensor's rows, its hash servers'
    rows, the result's rows per range), the same on every rank of every group. Their bytes share the node's link,
    so they are predicted together and take one plan (where it is BP, a partitioning each)."""
    layout, n = counts.layout, counts.layout.world_size
    mine = torch.tensor([layout.rows, *(x for r in rows for x in r), *counts.owned, *counts.range_union],
                        dtype=torch.int64, device=device)
    gathered = link.all_gather_v((mine,), phase="meta", bound=lambda j: [int(mine.numel())])
    groups, slowest = [], 0.0
    for (message,) in gathered:
        values = message.tolist()
        M, width = values[0], len(rows[0])
        table = [values[1 + i * width : 1 + (i + 1) * width] for i in range(n)]
        rest = values[1 + n * width :]
        shard = WireLayout(n, M, layout.width, layout.value_bytes, 4 if M < 2**31 else 8)
        groups.append(plans.Counts.from_rows(shard, table, rest[:n], rest[n:]))
        slowest = max(slowest, min(r[-1] for r in table) / 1e9)
    return groups, slowest


def _faster(a: tuple[str, float], b: tuple[str, float], first: bool) -> tuple[str, float]:
    """Of two timed (plan, seconds) the faster; within TIE of each other, `a` if `first` (the prediction's), else
    `b`."""
    if abs(a[1] - b[1]) <= TIE * max(a[1], b[1]):
        return a if first else b
    return a if a[1] < b[1] else b


def hc_verdict(timed: dict[str, float]) -> tuple[str, float]:
    """The HC-side plan kept from the trial's fastest times (plans in the order timed, the predicted one first):
    per plan, plain COO ids only where faster than gaps by more than TIE; of two plans the faster, the first
    on a tie."""
    kept: dict[str, tuple[str, float]] = {}
    for name, seconds in timed.items():
        base = name.removesuffix("-coo")
        if base not in kept or (name != base and seconds < (1 - TIE) * kept[base][1]):
            kept[base] = (name, seconds)
    first, *others = kept.values()
    for other in others:
        if other[1] < (1 - TIE) * first[1]:
            first = other
    return first


def range_rows(out: Output, bounds: torch.Tensor) -> list[int]:
    """The result's non-zero rows in each range [bounds[j], bounds[j + 1]): what BP over ranges would pull from each
    server. One pass over the result, at the call that decides; the same on every rank (the same result bits)."""
    if isinstance(out, RowsOutput):
        return torch.searchsorted(out.rows()[0].to(bounds.dtype), bounds).diff().tolist()
    assert isinstance(out, DenseOutput)
    mask = nonzero_rows(out.out).to(torch.int64)
    before = torch.cat([mask.new_zeros(1), torch.cumsum(mask, 0)])
    return before.index_select(0, bounds.to(torch.int64)).diff().tolist()
