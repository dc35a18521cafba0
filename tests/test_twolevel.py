"""Two-level sync (zen/twolevel.py): lossless and identical on every rank, simulated and on real gloo ranks,
its bytes per link class equal to the prediction, the DDP hook's two-level path trains like DDP's
allreduce, a world the nodes do not divide is refused on every rank, and on the emulated cluster a node's
ranks share one namespace whose uplink carries only the inter-node traffic."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import pytest
import torch

import zen
from harness.launch import spawn
from harness.reference import matches_reference, reference_sum
from zen.grad import to_local_grad
from zen.prediction import link_class, predict, uplink_bytes
from zen.types import WireLayout

from .cases import CASES, M, _dense, skewed_nodes

LAYOUTS = [(4, 2), (6, 2), (6, 3), (4, 4)]  # (world size, ranks per node): 2x2, 3x2, 2x3, one node of 4
SEED = 77


def zero_shard_case(rank: int, P: int, dtype: torch.dtype) -> torch.Tensor:
    """Non-zeros only in the first quarter of the rows: every later shard is all zero on every rank."""
    return _dense(torch.arange(rank % 3, M // 4, 5), rank, dtype)


def one_full_case(rank: int, P: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank 1 is dense everywhere, the others sparse."""
    return CASES["full" if rank == 1 else "random"](rank, P, dtype)


def tiny_case(rank: int, P: int, dtype: torch.dtype) -> torch.Tensor:
    """Three rows: fewer than four ranks per node leaves a shard empty."""
    return _dense(torch.tensor([0, 2]) if rank % 2 else torch.tensor([1]), rank, dtype, numel=3)


TWO_LEVEL_CASES = {**{c: CASES[c] for c in ("random", "empty_ranks", "all_empty", "identical", "disjoint", "matrix")},
                   "zero_shard": zero_shard_case, "one_full": one_full_case, "tiny": tiny_case}


def _layout_and_sets(tensors: list[torch.Tensor], rows: bool) -> tuple[WireLayout, list[torch.Tensor]]:
    grads = [to_local_grad(t, rows) for t in tensors]
    g = grads[0]
    layout = WireLayout(len(tensors), g.num_rows, g.row_width, g.dtype.itemsize, g.index_dtype().itemsize, SEED)
    return layout, [gr.rows()[0] for gr in grads]


def _expected(scheme: str, tensors: list[torch.Tensor], rows: bool, k: int, intra: str = "dense"
              ) -> list[dict[str, int]]:
    layout, sets = _layout_and_sets(tensors, rows)
    return [{p: v for p, v in phases.items() if v}
            for phases in predict(scheme, sets, layout, ranks_per_node=k, intra=intra)]


@pytest.mark.parametrize("intra", ["dense", "sparse"])
@pytest.mark.parametrize(("P", "k"), LAYOUTS)
@pytest.mark.parametrize("scheme", zen.schemes())
def test_lossless_and_bytes_as_predicted_sim(scheme: str, P: int, k: int, intra: str) -> None:
    for case, make in TWO_LEVEL_CASES.items():
        rows = case == "matrix"
        tensors = [make(r, P, torch.float32) for r in range(P)]
        total, magnitude = reference_sum(tensors)
        res = zen.simulate(scheme, tensors, warmup=2, seed=SEED, ranks_per_node=k, rows=rows, intra=intra)
        for r, out in enumerate(res.outputs):
            assert matches_reference(out, total, magnitude, P), f"{case}: wrong sum on rank {r}"
            assert torch.equal(out, res.outputs[0]), f"{case}: rank {r} differs from rank 0"
        for r, want in enumerate(_expected(scheme, tensors, rows, k, intra)):
            assert {p: v[r] for p, v in res.phases.items() if v[r]} == want, f"{case} rank {r}"
            assert all(link_class(p) in ("intra", "inter", "world") for p in want)


@pytest.mark.parametrize("intra", ["dense", "sparse"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_in_place_mean_and_dtypes_sim(dtype: torch.dtype, intra: str) -> None:
    """In place (DDP's buckets) with a divisor equals out of place divided, bit for bit, for every rank."""
    P, k = 6, 2
    tensors = [one_full_case(r, P, dtype) for r in range(P)]
    total, magnitude = reference_sum(tensors)
    apart = zen.simulate("zen", tensors, ranks_per_node=k, intra=intra)
    assert all(matches_reference(o, total, magnitude, P) for o in apart.outputs)
    inputs = [t.clone() for t in tensors]
    mean = zen.simulate("zen", inputs, outs=inputs, divisor=P, ranks_per_node=k, intra=intra)
    for o, m, t in zip(apart.outputs, mean.outputs, inputs, strict=True):
        assert m.data_ptr() == t.data_ptr() and torch.equal(m, o / P)


def test_two_level_moves_fewer_uplink_bytes_when_node_ranks_overlap() -> None:
    """Why two-level: identical rows on a node's ranks cross its uplink once, not once per rank."""
    P, k = 8, 2
    tensors = [CASES["identical"](r, P, torch.float32) for r in range(P)]
    flat = zen.simulate("zen-bp", tensors, warmup=1, seed=SEED)
    two = zen.simulate("zen-bp", tensors, warmup=1, seed=SEED, ranks_per_node=k)
    def busiest_uplink(res: Any) -> int:
        return max(uplink_bytes([s.traffic.received for s in res.stats], k))

    assert busiest_uplink(two) < busiest_uplink(flat)


def test_bad_layouts_and_inputs_are_refused() -> None:
    ones = [torch.ones(10) for _ in range(3)]
    for k in (0, 2):
        with pytest.raises(zen.ZenInputError, match="ranks_per_node"):
            zen.simulate("zen", ones, ranks_per_node=k)
    coo = torch.ones(4).to_sparse()
    with pytest.raises(zen.ZenInputError, match="dense"):
        zen.simulate("zen", [coo, coo], ranks_per_node=2)
    with pytest.raises(zen.ZenInputError, match="dense"):
        zen.simulate("zen", [torch.ones(4), torch.ones(4)], ranks_per_node=2, sparse_result=True)
    with pytest.raises(zen.ZenInputError, match="ranks_per_node"):
        zen.ZenHookState(ranks_per_node=0)


def test_closed_form_follows_the_exact_prediction() -> None:
    """costmodel.two_level: the dense intra bytes exactly, the inner scheme on the node shards closely."""
    from harness.bench.patterns import index_set
    from zen import costmodel

    n, k, rows = 8, 2, 1 << 16
    sets = [index_set("random", rows, 0.01, r, n, seed=3) for r in range(n)]
    exact = predict("zen-bp", sets, WireLayout(n, rows, seed=3), ranks_per_node=k)
    gamma_n = torch.unique(torch.cat(sets)).numel() / (sum(s.numel() for s in sets) / n)
    w = costmodel.Sparsity(n=n, rows=rows, density=0.01, gamma=costmodel.gamma_from_union(n, gamma_n))
    intra, inter = costmodel.two_level_cost(w, k, lambda s: costmodel.closed_form("zen-bp", s))
    assert intra == exact[0]["intra:reduce_scatter"] + exact[0]["intra:all_gather"] == 2 * (k - 1) / k * rows * 4
    across = [phases["inter:push"] + phases["inter:pull"] for phases in exact]
    assert inter.bytes_received == pytest.approx(sum(across) / n, rel=0.05)
    nodes = n // k
    allreduce = lambda s: costmodel.closed_form("allreduce", s)  # noqa: E731
    assert costmodel.two_level_cost(w, k, allreduce)[1].bytes_received == 2 * (nodes - 1) / nodes * rows / k * 4


def test_bench_sim_two_level_row() -> None:
    from harness.bench.harness import BenchConfig, run_bench

    rows = run_bench(BenchConfig(world_size=4, ranks_per_node=2, schemes=["allreduce", "zen"], numel=4000,
                                 repeats=1, warmup=1))
    assert all(r["correct"] and r["sync"] == "two-level" and r["ranks_per_node"] == 2 for r in rows)
    assert any(p.startswith("intra:") for p in rows[1]["phases_received_max"])
    assert rows[1]["uplink_received_max"] < rows[1]["bytes_received_max"]


# ---- real gloo ranks -------------------------------------------------------------------------------------
BYTE_SCHEMES = ["agsparse", "allreduce", "zen-hc", "sparcml"]  # bytes independent of a per-group hash seed


def real_ranks(k: int, schemes: list[str], bad_k: int, intra: str) -> dict[str, Any]:
    """Rank body: per case and scheme, whether zen.allreduce(..., ranks_per_node=k) is right and a digest
    of it; the received bytes per phase of one steady-state sync; what a bad ranks_per_node raised."""
    import torch.distributed as dist

    from zen.api import sync
    from zen.comm.dist import DistComm
    from zen.registry import make_scheme
    from zen.twolevel import dist_node_comms

    rank, P = dist.get_rank(), dist.get_world_size()
    comm, nodes = DistComm(), dist_node_comms(k, mode=intra)
    report: dict[str, Any] = {}
    for case, make in TWO_LEVEL_CASES.items():
        tensors = [make(r, P, torch.float32) for r in range(P)]
        total, magnitude = reference_sum(tensors)
        rows = case == "matrix"
        for scheme in schemes:
            for _ in range(3):  # zen measures on two calls, times HC on the third, then keeps its choice
                out = zen.allreduce(tensors[rank], scheme, rows=rows, ranks_per_node=k, intra=intra)
            digest = out.double().flatten().mul(torch.arange(out.numel()) % 89 + 1).sum().item()
            report[f"{scheme}/{case}"] = (matches_reference(out, total, magnitude, P), digest)
        for scheme in BYTE_SCHEMES:
            instance = make_scheme(scheme)
            for _ in range(2):  # the first call agrees on the seed
                _, stats = sync(instance, tensors[rank], comm, rows=rows, nodes=nodes)
            report[f"bytes/{scheme}/{case}"] = {p: v for p, v in stats.traffic.received.items() if v}
    report["bad_hook"] = _error_of(lambda: zen.ZenHookState(ranks_per_node=bad_k))
    report["bad_allreduce"] = _error_of(lambda: zen.allreduce(torch.ones(5), ranks_per_node=bad_k))
    return report


def real_ranks_each(k: int, schemes: list[str], bad_k: int, intras: list[str]) -> dict[str, dict[str, Any]]:
    """Rank body: real_ranks of every node step in one launch (each its own node groups and synchronizers)."""
    return {intra: real_ranks(k, schemes, bad_k, intra) for intra in intras}


def _error_of(fn: Any) -> str:
    try:
        fn()
    except zen.ZenInputError as exc:
        return str(exc)
    return "no error"


INTRAS = ["dense", "sparse"]
REAL_SCHEMES = ["zen", "zen-bp", "agsparse", "allreduce"]


@pytest.fixture(scope="module")
def real_reports() -> Callable[[int, int, int], list[dict[str, dict[str, Any]]]]:
    """real_ranks of both node steps in one launch per layout (the first test of a layout launches it)."""
    @functools.cache
    def launch(P: int, k: int, bad_k: int) -> list[dict[str, dict[str, Any]]]:
        return spawn("tests.test_twolevel:real_ranks_each", P,
                     {"k": k, "schemes": REAL_SCHEMES, "bad_k": bad_k, "intras": INTRAS}, timeout_s=900)

    return launch


@pytest.mark.slow
@pytest.mark.parametrize("intra", INTRAS)
@pytest.mark.parametrize(("P", "k", "bad_k"), [(4, 2, 3), (6, 2, 4)], ids=["2x2", "3x2"])
def test_lossless_and_bytes_real_gloo(P: int, k: int, bad_k: int, intra: str, real_reports: Callable) -> None:
    schemes = REAL_SCHEMES
    reports = [each[intra] for each in real_reports(P, k, bad_k)]
    for case, make in TWO_LEVEL_CASES.items():
        tensors = [make(r, P, torch.float32) for r in range(P)]
        for scheme in schemes:
            key = f"{scheme}/{case}"
            assert all(rep[key][0] for rep in reports), f"{key}: wrong sum"
            assert len({rep[key][1] for rep in reports}) == 1, f"{key}: ranks differ"
        for scheme in BYTE_SCHEMES:
            want = _expected(scheme, tensors, case == "matrix", k, intra)
            for r, rep in enumerate(reports):
                assert rep[f"bytes/{scheme}/{case}"] == want[r], f"{scheme}/{case} rank {r}"
    for rep in reports:
        assert "ranks_per_node" in rep["bad_hook"] and "ranks_per_node" in rep["bad_allreduce"]


def auto_ranks(k: int, calls: int, scheme_name: str = "zen-hc") -> list[tuple[str, bool]]:
    """Rank body: `intra="auto"` (the default) over `calls` calls of one size: each call's node steps (or
    flat) and whether its sum was right."""
    import torch.distributed as dist

    from zen.api import sync
    from zen.comm.dist import DistComm
    from zen.registry import make_scheme
    from zen.twolevel import dist_node_comms

    rank, P = dist.get_rank(), dist.get_world_size()
    comm, nodes, scheme = DistComm(), dist_node_comms(k), make_scheme(scheme_name)
    tensors = [TWO_LEVEL_CASES["matrix"](r, P, torch.float32) for r in range(P)]
    total, magnitude = reference_sum(tensors)
    seen = []
    for _ in range(calls):
        out, stats = sync(scheme, tensors[rank], comm, rows=True, nodes=nodes)
        seen.append((stats.intra, matches_reference(out, total, magnitude, P)))
    return seen


def auto_ranks_each(cases: list[dict[str, Any]]) -> list[list[tuple[str, bool]]]:
    """Rank body: auto_ranks of every case in one launch (each its own communicator, node groups and scheme)."""
    return [auto_ranks(**case) for case in cases]


@pytest.fixture(scope="module")
def auto_runs() -> dict[str, list[list[tuple[str, bool]]]]:
    """auto_ranks for zen-hc and for zen in one launch of 4 ranks: per scheme, each rank's calls."""
    from zen.algorithms.selector import ZenAuto
    from zen.twolevel import CANDIDATES, TRIAL_CALLS

    zen_auto = ZenAuto()
    settle = zen_auto.measure_iters + 2 * zen_auto.trial_iters  # BP's measuring calls, then each HC variant's
    cases = [{"k": 2, "calls": len(CANDIDATES) * TRIAL_CALLS + 2, "scheme_name": "zen-hc"},
             {"k": 2, "calls": len(CANDIDATES) * (settle + TRIAL_CALLS) + 2, "scheme_name": "zen"}]
    per_rank = spawn("tests.test_twolevel:auto_ranks_each", 4, {"cases": cases}, timeout_s=600)
    return {case["scheme_name"]: [runs[i] for runs in per_rank] for i, case in enumerate(cases)}


@pytest.mark.slow
def test_intra_auto_tries_each_then_all_ranks_keep_one(auto_runs: dict[str, list[list[tuple[str, bool]]]]) -> None:
    from zen.twolevel import CANDIDATES, TRIAL_CALLS

    trial = len(CANDIDATES) * TRIAL_CALLS
    per_rank = auto_runs["zen-hc"]
    assert all(len(seen) == trial + 2 for seen in per_rank)
    for seen in per_rank:
        assert all(ok for _, ok in seen)
        assert [m for m, _ in seen[:trial]] == ["dense", "sparse", "flat"] * TRIAL_CALLS
    kept = {m for seen in per_rank for m, _ in seen[trial:]}
    assert len(kept) == 1 and kept <= set(CANDIDATES)  # one choice, the same on every rank


@pytest.mark.slow
def test_intra_auto_times_zen_only_once_it_has_settled(auto_runs: dict[str, list[list[tuple[str, bool]]]]) -> None:
    """zen spends its first calls of a size choosing BP or HC (2 BP, then 2 of each HC variant): each candidate
    runs those untimed before its timed calls, so the trial compares the paths zen will keep, not BP's."""
    from zen.algorithms.selector import ZenAuto
    from zen.comm.sim import SimComm, SimGroup
    from zen.twolevel import CANDIDATES, TRIAL_CALLS

    zen_auto = ZenAuto()
    settle = zen_auto.measure_iters + 2 * zen_auto.trial_iters  # BP's measuring calls, then each HC variant's
    trial = len(CANDIDATES) * (settle + TRIAL_CALLS)
    per_rank = auto_runs["zen"]
    assert all(len(seen) == trial + 2 for seen in per_rank)
    for seen in per_rank:
        assert all(ok for _, ok in seen)
        assert [m for m, _ in seen[:trial]] == ["dense", "sparse", "flat"] * (settle + TRIAL_CALLS)
    kept = {m for seen in per_rank for m, _ in seen[trial:]}
    assert len(kept) == 1 and kept <= set(CANDIDATES)
    group = SimGroup(2)
    assert ZenAuto().settling_calls(SimComm(group, 0)) == 2  # no clock: BP's measuring calls only
    assert ZenAuto(choice="hc").settling_calls(SimComm(group, 0)) == 0


@pytest.mark.slow
def test_ddp_hook_two_level_trains_like_allreduce() -> None:
    """Embedding rows two-level (dense tables), COO gradients flat beside it: DDP's losses and parameters."""
    two = {"ranks_per_node": 2, "intra": "dense"}
    cases = [{"scheme": "ddp"}, {"scheme": "zen", "hook": two}, {"scheme": "agsparse", "hook": two},
             {"scheme": "zen", "sparse": True, "hook": two}, {"scheme": "zen", "hook": {**two, "asynchronous": False}},
             {"scheme": "zen", "hook": {**two, "intra": "sparse"}}, {"scheme": "zen", "hook": {"ranks_per_node": 2}}]
    per_rank = spawn("tests.ddp_cases:variants", 4, {"cases": cases}, timeout_s=600)
    reference = per_rank[0][0]
    for i, case in enumerate(cases):
        assert len({ranks[i]["checksum"] for ranks in per_rank}) == 1, f"{case}: parameters differ across ranks"
        got = per_rank[0][i]
        assert got["checksum"] == pytest.approx(reference["checksum"], rel=1e-5), case
        assert got["losses"] == pytest.approx(reference["losses"], rel=1e-5, abs=1e-5), case
    two_level = [any(p.startswith("intra:") for p in ranks[0]["phases"]) for ranks in zip(*per_rank, strict=True)]
    # DDP itself, and COO gradients flat; the default (auto) may have kept either node steps or none
    assert two_level[:6] == [False, True, True, False, True, True]


# ---- emulated cluster ------------------------------------------------------------------------------------
def node_ranks(k: int) -> dict[str, Any]:
    """Rank body: this rank's network namespace and a two-level zen sync of a 4 MB gradient (1% dense)."""
    import torch.distributed as dist

    from harness.bench.patterns import make_gradient
    from zen.api import sync
    from zen.comm.dist import DistComm
    from zen.registry import make_scheme
    from zen.twolevel import dist_node_comms

    rank, P = dist.get_rank(), dist.get_world_size()
    tensors = [make_gradient("random", 1 << 20, 0.01, r, P, seed=1) for r in range(P)]
    out, stats = sync(make_scheme("zen"), tensors[rank], DistComm(), nodes=dist_node_comms(k))
    total, magnitude = reference_sum(tensors)
    return {"netns": os.readlink("/proc/self/ns/net"), "ok": matches_reference(out, total, magnitude, P),
            "sent": dict(stats.traffic.sent)}


@pytest.mark.slow
def test_emulated_cluster_puts_a_node_in_one_namespace() -> None:
    from harness.netem import NetemError, emulated_cluster

    k = 2
    try:
        with emulated_cluster(4, "1gbit", ranks_per_node=k) as spec:
            got = spawn("tests.test_twolevel:node_ranks", 4, {"k": k}, timeout_s=300, **spec.spawn_kwargs())
            uplinks = [spec.link_bytes(n) for n in range(spec.num_nodes)]
    except NetemError as exc:
        pytest.skip(f"no emulated cluster here: {exc}")
    assert all(g["ok"] for g in got)
    assert got[0]["netns"] == got[1]["netns"] != got[2]["netns"] == got[3]["netns"]
    for n, (up, _) in enumerate(uplinks):  # the node-local dense phases never reach the shaper
        ranks = got[n * k : (n + 1) * k]
        intra = sum(v for g in ranks for p, v in g["sent"].items() if link_class(p) == "intra")
        inter = sum(v for g in ranks for p, v in g["sent"].items() if link_class(p) == "inter")
        assert inter <= up < intra / 4, (n, up, inter, intra)


@pytest.mark.slow
def test_ab_script_alternates_both_modes(capsys: pytest.CaptureFixture[str]) -> None:
    """scripts/twolevel_ab.py times flat and two-level zen in one launch: a row each, two-level's uplink bytes
    the lower (the node's union crosses once), and a refused layout exits 2."""
    import sys
    from pathlib import Path

    from harness.netem import NetemError

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import twolevel_ab

    with pytest.raises(SystemExit) as refused:
        twolevel_ab.main(["-n", "4", "--ranks-per-node", "4"])
    assert refused.value.code == 2
    try:
        assert twolevel_ab.main(["-n", "4", "--numel", "2^14", "--density", "0.05", "--calls", "2",
                                 "--warmup", "1"]) == 0
    except NetemError as exc:
        pytest.skip(f"no emulated cluster here: {exc}")
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[2:]}
    assert set(rows) == {"flat", "two-level"}
    assert float(rows["two-level"][4]) < float(rows["flat"][4])


@pytest.mark.parametrize(("intra", "rows_checked"), [("sparse", True), ("dense", False)])
def test_input_check_reads_the_rows_a_call_sends(intra: str, rows_checked: bool,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Sparse node steps send the rank's rows: they are extracted before the input check, whose NaN test then
    reads them, not the whole dense tensor (which cost a read of it on every call); dense steps send the dense
    shard and extract nothing ahead."""
    import zen.validate

    seen: list[int] = []
    real = zen.validate.all_finite
    monkeypatch.setattr(zen.validate, "all_finite", lambda t: seen.append(t.numel()) or real(t))
    tensors = [CASES["random"](r, 4, torch.float32) for r in range(4)]
    zen.simulate("zen", tensors, ranks_per_node=2, intra=intra)
    nonzero = {int(t.count_nonzero()) for t in tensors}
    assert len(seen) == 4 and (set(seen) == nonzero if rows_checked else set(seen) == {M})


def test_intra_trial_keeps_node_steps_within_tie_and_gives_each_candidate_its_scheme() -> None:
    """The choice: per candidate the median of its calls' slowest-rank times; node steps win a tie (TIE) with
    flat, the paper's dense ones a tie with sparse. Each candidate runs its own copy of the scheme, and so does
    each tensor size where the node steps are fixed (a copy sees one tensor size's shards)."""
    from zen.comm.sim import SimComm, SimGroup
    from zen.registry import make_scheme
    from zen.twolevel import CANDIDATES, TIE, TRIAL_CALLS, IntraTrial

    comm = SimComm(SimGroup(1), 0, torch.device("cpu"))

    def chosen(times: dict[str, float]) -> str:
        trial = IntraTrial()
        while trial.chosen is None:
            mode = trial.mode()
            trial.record(mode, times[mode] * (1 + 0.01 * trial.calls[mode]), comm)  # the median is the middle
        assert all(len(t) == TRIAL_CALLS for t in trial.times.values())
        return trial.chosen

    close = 1 + TIE / 2
    assert chosen({"dense": 3.0, "sparse": close, "flat": 1.0}) == "sparse"
    assert chosen({"dense": 3.0, "sparse": 1 + 2 * TIE, "flat": 1.0}) == "flat"
    assert chosen({"dense": close, "sparse": 1.0, "flat": 2.0}) == "dense"
    inner = make_scheme("zen")
    trial = IntraTrial()
    copies = {m: trial.scheme_for(m, inner) for m in CANDIDATES}
    assert len({id(s) for s in copies.values()} | {id(inner)}) == len(CANDIDATES) + 1
    assert all(trial.scheme_for(m, inner) is copies[m] for m in CANDIDATES)
    fixed = IntraTrial("sparse").scheme_for("sparse", inner)
    assert fixed is not inner and IntraTrial("sparse").scheme_for("sparse", inner) is not fixed


@pytest.mark.parametrize(("local_cost", "seed"), [(True, 12), (False, 2)], ids=["local-cost", "bytes"])
def test_shard_groups_choose_their_plans_together_as_the_step_simulator_does(local_cost: bool, seed: int) -> None:
    """A node's shard groups share its uplink: zen predicts their bytes together (`Communicator.shared_link`), takes
    one plan for them and, BP being it, each group's partitioning in the mix fastest together, as the step
    simulator's `zen_picks` does (bytes only), or the library's own prediction of the groups together (with local
    work). Here the groups predicted alone pick otherwise, and the mix is hashes for one group and ranges for the
    other; the byte prediction (`predict_side_by_side`) names the same plans."""
    from simulator.paper import zen_picks
    from zen.algorithms import plans
    from zen.algorithms.selector import ZenAuto
    from zen.twolevel import shard_bounds

    nodes, k, rows, width, alpha = 3, 2, 2048, 31, 5e-6
    options = {"local_cost": local_cost, "alpha": alpha, "bandwidth_gbps": 25.0}
    node_sets, tensors = skewed_nodes(seed, nodes, k, rows, width)
    bounds = shard_bounds(rows, k)
    shards = [[s[(s >= lo) & (s < hi)] - lo for lo, hi in zip(bounds, bounds[1:], strict=False)] for s in node_sets]
    sizes = [hi - lo for lo, hi in zip(bounds, bounds[1:], strict=False)]
    zen_ = ZenAuto(**options)
    groups = [plans.counts_of([shards[m][j] for m in range(nodes)], WireLayout(nodes, sizes[j], width), 0, zen_.bp)
              for j in range(k)]
    alone = [plans.best(plans.predicted_times(g, zen_.net, zen_._plans(), zen_.local)) for g in groups]
    together = plans.choose_side_by_side(groups, zen_.net, zen_._plans(), zen_.local)
    one = plans.best(plans.predicted_times(groups, zen_.net, zen_._plans(), zen_.local))
    if not local_cost:
        assert zen_picks(shards, sizes, width, [25e9], alpha)[25e9] == tuple(together)
    assert alone != together, "the case should make the groups alone pick otherwise"
    assert sorted(together) == ["bp", "bp-range"] and one in together, "the case should make the groups' BPs differ"
    res = zen.simulate("zen", tensors, warmup=2, seed=0, rows=True, ranks_per_node=k, intra="dense", **options)
    total, magnitude = reference_sum(tensors)
    assert all(matches_reference(out, total, magnitude, nodes * k) for out in res.outputs)
    assert [s.choice for s in res.stats] == [together[r % k] for r in range(nodes * k)]
    layout = WireLayout(nodes * k, rows, width, 4, 4, 0)
    predicted = predict("zen", [t.any(1).nonzero().view(-1) for t in tensors], layout, ranks_per_node=k,
                        intra="dense", **options)
    for r, want in enumerate(predicted):
        assert {p: v[r] for p, v in res.phases.items() if v[r]} == {p: v for p, v in want.items() if v}


def test_a_shard_groups_mix_of_partitions_is_never_predicted_slower_than_one_for_all() -> None:
    """`plans.partitions_side_by_side` starts from the one partitioning for all and keeps a group's change only where
    the groups' predicted time gets shorter: on random skewed nodes it is never longer, the same on a second call
    (every rank computes it), and groups without rows keep the pick."""
    from zen.algorithms import plans
    from zen.algorithms.selector import ZenAuto
    from zen.twolevel import shard_bounds

    nodes, k, rows, width = 3, 2, 2048, 31
    zen_ = ZenAuto(alpha=5e-6, bandwidth_gbps=25.0)
    mixed = 0
    for seed in range(12):
        node_sets, _ = skewed_nodes(seed, nodes, k, rows, width)
        bounds = shard_bounds(rows, k)
        groups = [plans.counts_of([s[(s >= lo) & (s < hi)] - lo for s in node_sets], WireLayout(nodes, hi - lo, width),
                                  0, zen_.bp) for lo, hi in zip(bounds, bounds[1:], strict=False)]
        empty = plans.counts_of([torch.empty(0, dtype=torch.int64)] * nodes, WireLayout(nodes, 1024, width), 0, zen_.bp)
        groups.append(empty)
        times = plans.predicted_times(groups, zen_.net, zen_._plans(), zen_.local)
        bp = plans.families(times)[0]
        mix, after = plans.partitions_side_by_side(groups, zen_.net, zen_._plans(), zen_.local, times)
        assert after[bp] <= times[bp] and mix[-1] == bp
        assert (mix, after) == plans.partitions_side_by_side(groups, zen_.net, zen_._plans(), zen_.local, times)
        assert {p: t for p, t in after.items() if p != bp} == {p: t for p, t in times.items() if p != bp}
        mixed += len(set(mix)) > 1
    assert mixed >= 2, "some of these nodes should split their groups' partitionings"


def test_shard_groups_choose_together_when_two_tensor_sizes_share_a_shard_size() -> None:
    """Tensors of 301 and 300 rows at 2 ranks a node: local rank 0's shards have 151 and 150 rows, local rank 1's
    150 and 150. Each tensor size has its own copy of zen (`IntraTrial.scheme_for`), so both local ranks choose
    each size's plan in the same call, as their joint prediction's all-gather inside the node needs."""
    from zen.core.build import simulated
    from zen.core.config import SyncConfig

    P, k = 4, 2
    group, syncers = simulated(SyncConfig(scheme="zen", ranks_per_node=k, intra="dense", rows=True),
                               [torch.device("cpu")] * P, 60.0, SEED)
    sizes = [301, 300] * 4
    tensors = [[CASES["random"](r, P, torch.float32)[: 3 * rows].view(rows, 3) for r in range(P)] for rows in sizes]

    def rank_main(r: int) -> list[torch.Tensor]:
        return [zen.api._one(syncers[r], call[r], None)[0] for call in tensors]

    for outs, call in zip(zip(*group.run(rank_main), strict=True), tensors, strict=True):
        total, magnitude = reference_sum(call)
        assert all(matches_reference(out, total, magnitude, P) for out in outs)
