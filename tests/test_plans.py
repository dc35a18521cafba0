"""zen's plans (zen.algorithms.plans): each regime gets the plan the prediction says is fastest, lossless, with the
bytes `predict` says; the predicted times follow the exact counts (the busiest server, not the mean)."""

from __future__ import annotations

import pytest
import torch

import zen
from harness.bench.patterns import make_gradient
from harness.reference import matches_reference, reference_sum
from zen import costmodel
from zen.algorithms import plans
from zen.prediction import layout_and_sets, predict
from zen.registry import make_scheme
from zen.types import WireLayout


def _dense_halves(P: int, rows: int = 8192, zero: float = 0.5, width: int = 1) -> list[torch.Tensor]:
    """Every rank's rows full at random but for a `zero` fraction (half by default): the union is near-dense, so
    no skew is left for hashing to balance."""
    out = []
    for r in range(P):
        g = torch.Generator().manual_seed(100 + r)
        t = torch.randn(rows, width, generator=g).squeeze(1)
        t[torch.rand(rows, generator=g) < zero] = 0
        out.append(t)
    return out


def _run(tensors: list[torch.Tensor], seed: int = 9) -> zen.SimResult:
    """zen after its measuring calls, lossless and identical on every rank, with the bytes `predict` says."""
    P = len(tensors)
    res = zen.simulate("zen", tensors, seed=seed, warmup=2)
    total, magnitude = reference_sum(tensors)
    assert all(matches_reference(o, total, magnitude, P) and torch.equal(o, res.outputs[0]) for o in res.outputs)
    layout, sets = layout_and_sets(tensors, seed)
    for r, phases in enumerate(predict("zen", sets, layout)):
        assert {p: v[r] for p, v in res.phases.items() if v[r]} == {p: v for p, v in phases.items() if v}
    return res


@pytest.mark.parametrize("P", [8, 16])
def test_near_dense_union_takes_equal_ranges(P: int) -> None:
    """Ranks a tenth (8) or a twentieth (16) full: the union is over half full and the ranges' pull is even where
    the hash servers' S_j are not; each rank's rows are still sparse enough that the sparse plans beat the dense
    all-reduce: the selector takes BP over ranges."""
    assert _run(_dense_halves(P, 1 << 13, 1 - 0.8 / P, 16)).stats[0].choice == "bp-range"


@pytest.mark.parametrize("P", [3, 4])
def test_dense_ranks_take_the_dense_all_reduce(P: int) -> None:
    """Half-full ranks: the union is 87-94% full, ids would cost bytes that the union does not save and every
    sparse plan walks rows that a dense pass does not: the selector takes the dense all-reduce."""
    assert _run(_dense_halves(P)).stats[0].choice == "allreduce"


@pytest.mark.parametrize("P", [3, 4, 5])
def test_rows_ranks_barely_share_take_the_all_gather(P: int) -> None:
    """Sparse random rows: HC's rounds save (nearly) nothing over one all-gather, which skips the merges; on disjoint
    blocks (4 ranks) HC's codes of the denser unions save a few bytes, less than its merges and rounds cost here."""
    tensors = [make_gradient("random", 1 << 18, 0.01, r, P, seed=1) for r in range(P)]
    assert _run(tensors).stats[0].choice == "ag"
    if P == 4:
        blocks = [make_gradient("disjoint", 1 << 14, 0.02, r, P, seed=1) for r in range(P)]
        assert _run(blocks).stats[0].choice == "ag"


def test_overlap_keeps_bp_over_hashes_and_hc() -> None:
    """Zipf rows (skewed, overlapping) on 16 ranks: BP over hash partitions, as before; identical sparse rows: HC."""
    zipf = [make_gradient("zipf", 1 << 18, 0.01, r, 16, seed=1) for r in range(16)]
    assert _run(zipf).stats[0].choice == "bp"
    same = [make_gradient("identical", 1 << 16, 0.0005, r, 8, seed=1) for r in range(8)]
    assert _run(same).stats[0].choice == "hc"


def test_predicted_times_follow_the_busiest_server() -> None:
    """Partitionings that push and pull the same bytes in all: the one whose busiest server takes more pushes,
    or sends a larger pull, is predicted slower."""
    layout = WireLayout(4, 4000, 1, 4, 4)
    even = [[250] * 4 for _ in range(4)]
    skewed = [[400, 200, 200, 200] for _ in range(4)]
    net = costmodel.Network(alpha=0.0, bandwidth=1e9)
    schemes = {name: make_scheme("zen").plan(name) for name in plans.PLANS}

    def times(hash_push: list[list[int]], served: list[int], range_push: list[list[int]], range_union: list[int]
              ) -> dict[str, float]:
        counts = plans.Counts(layout, [1000] * 4, hash_push, served, [1000] * 4, range_push, [1000] * 4, range_union)
        return plans.predicted_times(counts, net, schemes)

    pushes = times(skewed, [550] * 4, even, [550] * 4)  # the same pulls
    assert pushes["bp-range"] < pushes["bp"]
    pulls = times(even, [700, 500, 500, 500], even, [550] * 4)  # the same pushes
    assert pulls["bp-range"] < pulls["bp"]
    assert plans.families(pulls)[0] == "bp-range"
    assert plans.families(times(even, [550] * 4, even, [700, 500, 500, 500]))[0] == "bp"


@pytest.mark.parametrize("choice", plans.PLANS)
@pytest.mark.parametrize("P", [1, 3, 4])
def test_every_plan_lossless_with_its_bytes(choice: str, P: int) -> None:
    """Each plan fixed (`choice`): lossless on random and near-dense rows, bytes as its scheme predicts."""
    for tensors in ([make_gradient("random", 5003, 0.02, r, P, seed=3) for r in range(P)], _dense_halves(P, 5003)):
        total, magnitude = reference_sum(tensors)
        res = zen.simulate("zen", tensors, seed=5, choice=choice, warmup=1)  # the seed is fetched once
        assert all(matches_reference(o, total, magnitude, P) and torch.equal(o, res.outputs[0]) for o in res.outputs)
        layout, sets = layout_and_sets(tensors, 5)
        for r, phases in enumerate(predict("zen", sets, layout, choice=choice)):
            assert {p: v[r] for p, v in res.phases.items() if v[r]} == {p: v for p, v in phases.items() if v}


def test_shard_groups_share_their_nodes_links() -> None:
    """Two-level sync's shard groups side by side: each alone has its ranges' busiest server fuller than its hash
    servers' (BP over hashes), but their ranges crowd different nodes, so predicted together (bytes added per
    node) the ranges are even and the hashes are not."""
    layout = WireLayout(4, 4000, 1, 4, 4)
    even = [[250] * 4 for _ in range(4)]
    net = costmodel.Network(alpha=0.0, bandwidth=1e9)
    schemes = {name: make_scheme("zen").plan(name) for name in plans.PLANS}

    def counts(served: list[int], range_union: list[int]) -> plans.Counts:
        return plans.Counts(layout, [1000] * 4, even, served, [1000] * 4, even, [1000] * 4, range_union)

    a = counts([600, 550, 525, 525], [700, 500, 500, 500])
    b = counts([650, 520, 515, 515], [500, 700, 500, 500])
    for alone in (a, b):
        assert plans.families(plans.predicted_times(alone, net, schemes))[0] == "bp"
    together = plans.predicted_times([a, b], net, schemes)
    assert plans.families(together)[0] == "bp-range"
    assert together["bp"] > max(plans.predicted_times(g, net, schemes)["bp"] for g in (a, b))
    empty = plans.Counts(layout, [0] * 4, [[0] * 4] * 4, [0] * 4, [0] * 4, [[0] * 4] * 4, [1000] * 4, [0] * 4)
    assert plans.predicted_times([a, empty], net, schemes) == plans.predicted_times(a, net, schemes)  # a shard of
    # fewer rows than the node has ranks is empty on every node


def test_local_cost_is_measured_stored_and_priced(tmp_path) -> None:
    """The local cost's constants come from timing merge_rows here, round-trip through JSON, and `zen` prices its
    plans with the package's stored ones (or bytes only, `local_cost=False`); a plan that walks more rows in more
    steps is predicted slower by exactly their price."""
    from zen.algorithms.localcost import LocalCost, measure

    measured = measure(repeats=3)
    assert measured.row_s > 0 and measured.step_s > 0 and measured.byte_s >= 0
    measured.save(tmp_path / "cost.json")
    assert LocalCost.load(tmp_path / "cost.json") == measured
    assert make_scheme("zen").local == LocalCost.default() and LocalCost.default().row_s > 0
    assert make_scheme("zen", local_cost=False).local == LocalCost()
    layout = WireLayout(4, 4000, 1, 4, 4)
    even = [[250] * 4 for _ in range(4)]
    c = plans.Counts(layout, [1000] * 4, even, [1000] * 4, [1000] * 4, even, [1000] * 4, [1000] * 4)
    net = costmodel.Network(alpha=0.0, bandwidth=1e9)
    schemes = {name: make_scheme("zen").plan(name) for name in plans.PLANS}
    bytes_only = plans.predicted_times(c, net, schemes)
    priced = plans.predicted_times(c, net, schemes, LocalCost(row_s=1e-6, byte_s=0.0, step_s=1e-3))
    # BP: 3 kernel steps and 2 (n - 1) messages; walks its hashed rows, what it was pushed, what it serves, the union
    assert priced["bp"] - bytes_only["bp"] == pytest.approx(9e-3 + 1e-6 * (1000 + 1000 + 1000 + 4000))
    assert priced["bp-range"] - bytes_only["bp-range"] == pytest.approx(9e-3 + 1e-6 * (1000 + 1000 + 4000))


def test_link_rate_measured_from_bp_calls() -> None:
    """On a clock, the link's rate is what BP's call measured: its busiest bytes over the call less its local work
    and latency (at least a tenth of the call), so a slow link makes bytes decide and a fast one local work."""
    from zen.algorithms.localcost import LocalCost

    layout = WireLayout(4, 4000, 1, 4, 4)
    even = [[250] * 4 for _ in range(4)]
    c = plans.Counts(layout, [1000] * 4, even, [1000] * 4, [1000] * 4, even, [1000] * 4, [1000] * 4)
    schemes = {name: make_scheme("zen").plan(name) for name in plans.PLANS}
    local = LocalCost(row_s=1e-6, byte_s=0.0, step_s=1e-3)
    net = costmodel.Network(alpha=1e-4, bandwidth=1e9)
    load = plans.loads(c, schemes)["bp"]
    spent = load.local_seconds(local) + load.hops * net.alpha
    slow = plans.measured_link(c, spent + 2.0, net, schemes, local)
    assert slow.alpha == net.alpha and slow.bandwidth == pytest.approx(load.busy_bytes() / 2.0)
    fast = plans.measured_link(c, spent, net, schemes, local)  # local work explains the whole call
    assert fast.bandwidth == pytest.approx(load.busy_bytes() / (0.1 * spent))


def test_hc_keeps_its_rounds_unless_the_all_gather_is_predicted_faster() -> None:
    """The prediction prices HC's merges, so the all-gather gets no margin on top: HC 3% ahead stays HC (with a 5%
    margin the all-gather had won on the emulated cluster, where HC's saved bytes made it 10-20% faster)."""
    times = {"bp": 2.0, "bp-range": 2.0, "hc": 1.0, "ag": 1.03, "hc-coo": 1.1, "ag-coo": 1.2}
    assert plans.families(times) == ("bp", "hc") and plans.best(times) == "hc"
    assert plans.families({**times, "ag": 0.99})[1] == "ag" and plans.families(times, "coo")[1] == "hc-coo"


def test_the_trial_times_hc_and_its_all_gather_where_the_prediction_cannot_tell_them_apart() -> None:
    """HC and its all-gather predicted within TIE: the trial times both plans in each id encoding, one call each, as
    many calls as it times otherwise (what the trial costs does not grow); apart, HC's plan alone, two calls of each
    encoding. The prediction leaves out a round's fixed cost, which decides there on a fast link."""
    from zen.algorithms.selector import ZenAuto

    close = {"bp": 2.0, "bp-range": 2.0, "hc": 1.0, "ag": 1.03, "hc-coo": 1.1, "ag-coo": 1.2}
    apart = {**close, "ag": 1.2}
    assert ZenAuto()._trial_plans(close, "hc") == (("hc", "hc-coo", "ag", "ag-coo"), 1)
    assert ZenAuto()._trial_plans(apart, "hc") == (("hc", "hc-coo"), 2)
    assert ZenAuto(hc_ids="gaps")._trial_plans(close, "hc") == (("hc", "ag"), 1)
    assert ZenAuto(hc_ids="coo")._trial_plans(close, "hc-coo") == (("hc-coo", "ag-coo"), 1)
    assert ZenAuto(trial_iters=1)._trial_plans(close, "hc") == (("hc", "hc-coo"), 1)  # no call to spare
    assert ZenAuto(trial_iters=3)._trial_plans(close, "ag")[0] == ("ag", "ag-coo", "hc", "hc-coo")


def test_the_trial_keeps_the_faster_hc_plan_and_plain_ids_only_where_clearly_faster() -> None:
    """Per plan plain COO ids only where faster than gaps by more than TIE; of HC and its all-gather the faster,
    the one the prediction put first on a tie."""
    from zen.algorithms.selector import hc_verdict

    assert hc_verdict({"hc": 1.0, "hc-coo": 0.97, "ag": 0.8, "ag-coo": 0.7}) == ("ag-coo", 0.7)
    assert hc_verdict({"hc": 1.0, "hc-coo": 0.9, "ag": 0.97, "ag-coo": 1.0}) == ("hc-coo", 0.9)
    assert hc_verdict({"ag": 1.0, "ag-coo": 0.97, "hc": 0.96, "hc-coo": 0.99}) == ("ag", 1.0)
    assert hc_verdict({"hc": 1.0, "hc-coo": 0.5}) == ("hc-coo", 0.5)


def test_the_trial_times_the_dense_all_reduce_where_it_is_predicted_fastest() -> None:
    """The dense all-reduce predicted fastest by RANGE_MARGIN: the trial times it beside HC's plan, in no more
    calls than the trial has without it; where it is not, it is not timed."""
    from zen.algorithms.selector import ZenAuto

    dense = {"bp": 2.0, "bp-range": 2.0, "hc": 1.0, "ag": 1.03, "hc-coo": 1.1, "ag-coo": 1.2, "allreduce": 0.5}
    assert plans.dense_wins(dense) and plans.best(dense) == "allreduce"
    assert not plans.dense_wins({**dense, "allreduce": 0.995}) and plans.best({**dense, "allreduce": 0.995}) == "hc"
    assert ZenAuto()._trial_plans(dense, "hc", True) == (("hc", "hc-coo", "allreduce"), 1)  # 3 calls of 4
    assert ZenAuto(hc_ids="gaps")._trial_plans(dense, "hc", True) == (("hc", "allreduce"), 1)
    assert ZenAuto(trial_iters=1)._trial_plans(dense, "hc", True) == (("hc", "allreduce"), 1)
    assert ZenAuto(trial_iters=1, hc_ids="gaps")._trial_plans(dense, "hc", True) == (("allreduce",), 1)
    assert ZenAuto(trial_iters=4, hc_ids="gaps")._trial_plans(dense, "hc", True) == (("hc", "ag", "allreduce"), 1)
    for z in (ZenAuto(), ZenAuto(trial_iters=1), ZenAuto(hc_ids="gaps", trial_iters=1), ZenAuto(trial_iters=3)):
        timed, each = z._trial_plans(dense, "hc", True)
        assert len(timed) * each <= z._trial_budget() and "allreduce" not in z._trial_plans(dense, "hc")[0]



@pytest.mark.parametrize("P", [3, 4])
def test_the_trial_keeps_the_dense_all_reduce_only_where_its_calls_were_not_slower(P: int) -> None:
    """On gloo (a clock that means something), every row full: the dense all-reduce is predicted fastest whatever
    rate BP's calls measured the link at (a third fewer bytes than BP, no ids, less local work); the trial times it
    and keeps it unless the fastest sparse plan's calls beat it by more than TIE; every call lossless, every rank the
    same plan. (Half-full rows move only 0.2% fewer bytes dense: there the measured rate decides, and a loaded
    machine's slow calls make bytes decide.)"""
    from harness.launch import spawn

    reports = spawn("tests.dist_cases:dense_trial", P, timeout_s=240)
    assert all(r["correct"] for r in reports) and len({r["choices"] for r in reports}) == 1
    choices, extra = reports[0]["choices"], reports[0]["extra"]
    assert "allreduce" in choices[:-1], choices  # timed in the trial
    sparse = min(extra["bp_trial_s"], extra.get("hc_trial_s", float("inf")))
    dense = extra["dense_trial_s"]
    assert (choices[-1] == "allreduce") == (dense <= sparse or abs(dense - sparse) <= plans.TIE * max(dense, sparse))
