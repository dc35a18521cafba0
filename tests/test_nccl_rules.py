"""Zen under NCCL's rules, proven on CPU: every scheme, the DDP hook, two-level sync and every compressor run on
the NCCL-rules test double (tests/nccl_rules.py: gloo underneath, NCCL's ordering, equal-size all-gathers,
completion at enqueue with poisoned outputs until the wait, counted host reads) with Zen's accelerator code
path, at world sizes 2, 3, 4 and 8; and the double itself catches what it must."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest

import zen
from harness.launch import spawn
from zen.compress import compressors

from .cases import CASES
from .helpers import at_once, selected, value

pytestmark = [pytest.mark.nccl_rules, pytest.mark.slow]  # ranks in processes of their own
EMULATE = {"ZEN_EMULATE_ACCELERATOR": "1"}
WORLD_SIZES = [2, 3, 4, 8]


def _spawn(target: str, P: int, kwargs: dict[str, Any] | None = None, env: dict[str, str] | None = None,
           pg_timeout_s: float = 120.0, timeout_s: float = 900) -> list:
    return spawn(f"tests.nccl_cases:{target}", P, kwargs or {}, backend="ncclrules", timeout_s=timeout_s,
                 pg_timeout_s=pg_timeout_s, env=lambda r: {**EMULATE, **(env or {})})


@pytest.mark.parametrize("P", WORLD_SIZES)
def test_every_scheme_is_lossless_with_one_host_read_per_round(P: int) -> None:
    cases = ["random", "edges", "empty_ranks", "coo"] if P <= 4 else ["random", "coo"]
    assert set(cases) <= set(CASES)
    reports = _spawn("schemes", P, {"names": zen.schemes(), "cases": cases, "ranks_per_node": 2 if P % 2 == 0 else 1})
    for key, (ok, digest, reads, rounds, counted) in reports[0].items():
        assert ok, f"P={P} {key}: wrong sum on rank 0"
        for r in range(1, P):
            assert reports[r][key][0] and reports[r][key][1] == digest, f"P={P} {key}: rank {r} differs"
        if not key.endswith("two_level"):
            for report in reports:  # every scheme: at most one host read per exchange round
                _, _, reads, rounds, counted = report[key]
                assert reads <= rounds and counted <= rounds, f"P={P} {key}: {reads} reads, {rounds} rounds"


def test_shard_groups_taking_different_partitionings_under_nccl_rules() -> None:
    """3 nodes of 2 ranks whose shard groups' joint prediction gives one group hashes and the other ranges
    (`plans.choose_side_by_side`, by bytes, hash partitions from seed 0): under NCCL's rules every rank's sum is
    exact and the same, and each rank runs its group's partitioning."""
    from zen.algorithms import plans
    from zen.algorithms.selector import ZenAuto
    from zen.twolevel import shard_bounds
    from zen.types import WireLayout

    from .cases import skewed_nodes

    seed, nodes, k, rows, width = 1, 3, 2, 2048, 31
    node_sets, _ = skewed_nodes(seed, nodes, k, rows, width)
    bounds = shard_bounds(rows, k)
    z = ZenAuto(local_cost=False)
    groups = [plans.counts_of([s[(s >= lo) & (s < hi)] - lo for s in node_sets], WireLayout(nodes, hi - lo, width), 0,
                              z.bp) for lo, hi in zip(bounds, bounds[1:], strict=False)]
    together = plans.choose_side_by_side(groups, z.net, z._plans(), z.local)
    assert sorted(together) == ["bp", "bp-range"], "the case should give the groups different partitionings"
    reports = _spawn("shard_group_mix", nodes * k, {"seed": seed, "ranks_per_node": k, "rows": rows, "width": width})
    assert all(ok for ok, _, _ in reports) and len({digest for _, digest, _ in reports}) == 1
    assert [choice for _, _, choice in reports] == [together[r % k] for r in range(nodes * k)]


def _setting(case: dict[str, Any]) -> str:
    """What the reference DDP run must share with a case: everything but the scheme, the hook's settings and
    the embeddings' gradient layout (the reference's are dense: DDP's own all-reduce of COO gradients over
    gloo corrupts the heap now and then, workloads/torch_hooks.py; the same sums)."""
    return repr(sorted((k, repr(v)) for k, v in case.items() if k not in ("scheme", "hook", "sparse")))


@pytest.mark.parametrize("P", WORLD_SIZES)
def test_hook_trains_like_ddp_under_nccl_rules(P: int) -> None:
    """Dense and COO embeddings, bucket views, a static graph, no_sync accumulation, the hook in the call; and
    two-level sync where the world has nodes of two ranks. Reference: DDP's own allreduce (on gloo) with the
    same DDP options."""
    settings: list[dict[str, Any]] = [{}, {"sparse": True}, {"ddp": {"gradient_as_bucket_view": True}},
                                      {"ddp": {"static_graph": True}}, {"accumulate": 2}]
    cases: list[dict[str, Any]] = [{"scheme": "ddp", **s} for s in settings if not s.get("sparse")]
    cases += [{"scheme": sch, **s} for s in settings for sch in ("zen", "allreduce")]
    cases += [{"scheme": "zen", "hook": {"asynchronous": False}},
              {"scheme": "zen", "sparse": True, "hook": {"lanes": 1}}]
    if P in (2, 3):
        cases += [{"scheme": s} for s in zen.schemes() if s not in ("zen", "allreduce")]
    if P % 2 == 0 and P > 2:
        cases += [{"scheme": "zen", "hook": {"ranks_per_node": 2}},  # auto: trials dense, sparse and flat
                  {"scheme": "zen", "hook": {"ranks_per_node": 2, "intra": "dense"}},
                  {"scheme": "zen", "hook": {"ranks_per_node": 2, "intra": "sparse"}}]
    per_rank = _spawn("hooks", P, {"cases": cases})
    results = list(zip(*per_rank, strict=True))
    reference = {_setting(c): r[0]["losses"] for c, r in zip(cases, results, strict=True) if c["scheme"] == "ddp"}
    for case, ranks in zip(cases, results, strict=True):
        assert len({r["checksum"] for r in ranks}) == 1, f"P={P} {case}: parameters differ across ranks"
        want, got = reference[_setting(case)], ranks[0]["losses"]
        assert all(abs(a - b) <= 1e-5 * max(1.0, abs(b)) for a, b in zip(got, want, strict=True)), case


@pytest.mark.parametrize("P", WORLD_SIZES)
def test_every_compressor_under_nccl_rules(P: int) -> None:
    """Each rank's gradient is the mean of what the compressors sent, on the accelerator path (draws on the
    tensor's device, no host reads of thresholds)."""
    cases = [{"scheme": "zen", "compress": c} for c in compressors()]
    per_rank = _spawn("compressors", P, {"cases": cases})
    import torch

    for k, case in enumerate(cases):
        ranks = [results[k] for results in per_rank]
        for rank in ranks:
            assert torch.allclose(rank["grads"].double(), rank["expected"], rtol=1e-6, atol=1e-7), case
            assert torch.equal(rank["grads"], ranks[0]["grads"]), case


READ_CASES = [("zen", False), ("zen", True), *((s, False) for s in zen.schemes() if s != "zen")]


@pytest.fixture(scope="module")
def hook_reads() -> dict[tuple[str, bool], list[dict[str, int]]]:
    """Every case of test_hook_host_reads_per_bucket in one launch of 4 ranks: per case, each rank's counts."""
    cases = [{"scheme": scheme, "sparse": sparse} for scheme, sparse in READ_CASES]
    per_rank = _spawn("hook_reads_of", 4, {"cases": cases})
    return {case: [got[k] for got in per_rank] for k, case in enumerate(READ_CASES)}


@pytest.mark.parametrize(("scheme", "sparse"), READ_CASES)
def test_hook_host_reads_per_bucket(scheme: str, sparse: bool, hook_reads: dict) -> None:
    """A steady-state step's backward reads device data on the host at most once per exchange round, as the
    double counts (every thread) and as the communicator counts."""
    for got in hook_reads[(scheme, sparse)]:
        assert got["read"] <= got["rounds"], got
        assert got["counted"] <= got["rounds"], got


# ---- Zen against the hazards only the stricter double shows --------------------------------------
def test_zen_deadline_fires_before_the_watchdog() -> None:
    """A rank stops taking part after a step (alive, silent past every timeout): the others raise ZenCommError
    from backward within Zen's deadline (3 s), counted from the operations' issue, long before the hook's groups'
    watchdog (Zen's timeout + 30 s) would tear them down (the double exits with status 86 where it acts)."""
    P = 3
    got = _spawn("stalled_peer", P, {"scheme": "zen"}, env={"ZEN_TIMEOUT_S": "3"}, timeout_s=180)
    for message in got[:-1]:
        assert "ZenCommError" in message and "did not complete within 3s" in message, message
        assert int(message.split(" after ")[1].split("s")[0]) < 30, message
    assert got[-1] == "stalled"


TIMEOUT_CASES = [(None, "15.0"), (10.0, "10.0"), (30.0, "ZenInputError")]


@pytest.fixture(scope="module")
def timeouts_against_group() -> dict[float | None, list[str]]:
    """Every case of test_zen_timeout_against_the_group_timeout in one launch (a communicator each)."""
    cases = [zen_timeout_s for zen_timeout_s, _ in TIMEOUT_CASES]
    per_rank = _spawn("timeouts_against_group", 2, {"cases": cases}, pg_timeout_s=20)
    return {case: [got[k] for got in per_rank] for k, case in enumerate(cases)}


@pytest.mark.parametrize(("zen_timeout_s", "want"), TIMEOUT_CASES)
def test_zen_timeout_against_the_group_timeout(zen_timeout_s: float | None, want: str,
                                               timeouts_against_group: dict) -> None:
    """A group whose watchdog acts after 20 s: Zen's default timeout is shortened to end first (by a quarter of it);
    a shorter one is kept; a longer one the user chose is refused at the first call, saying what to change."""
    for got in timeouts_against_group[zen_timeout_s]:
        assert got.startswith(want), got
        if want == "ZenInputError":
            assert "process group's own timeout of 20s" in got and "watchdog" in got, got


SLEEP_CASES = [("zen", False), ("zen", True)]


@pytest.fixture(scope="module")
def thread_sleeps() -> dict[tuple[str, bool], list[dict[str, int]]]:
    """Every case of test_hook_waits_without_polling in one launch of 2 ranks."""
    per_rank = _spawn("thread_sleeps_of", 2, {"cases": [{"scheme": c, "sparse": s} for c, s in SLEEP_CASES]})
    return {case: [got[k] for got in per_rank] for k, case in enumerate(SLEEP_CASES)}


@pytest.mark.parametrize(("scheme", "sparse"), SLEEP_CASES)
def test_hook_waits_without_polling(scheme: str, sparse: bool, thread_sleeps: dict) -> None:
    """No thread of the hook, nor backward's, sleeps in a steady-state step: they wait on futures (completion on
    the double is learned by the communicator's completion thread, zen.comm.completion), never in a poll loop."""
    for got in thread_sleeps[(scheme, sparse)]:
        assert got == {}, got


@pytest.mark.parametrize("P", [2, 3])
def test_hook_and_ddp_share_one_stream_without_deadlock(P: int) -> None:
    """Every communicator of a rank on one stream (NCCL's worst case on one device): the hook's lane group and DDP's
    own (find_unused_parameters' map all-reduce at the step's end) never meet in rank-dependent orders, since the
    step's last bucket runs after the lane has issued everything (zen.ddp.worker.CommWorker.submit)."""
    cases = [{"scheme": "ddp", "branch": True, "ddp": {"find_unused_parameters": True}},
             {"scheme": "zen", "branch": True, "ddp": {"find_unused_parameters": True}},
             {"scheme": "zen", "sparse": True, "branch": True, "ddp": {"find_unused_parameters": True}}]
    per_rank = _spawn("hooks", P, {"cases": cases}, env={"ZEN_RULES_ONE_STREAM": "1"})
    results = list(zip(*per_rank, strict=True))
    want = results[0][0]["losses"]
    for case, ranks in zip(cases, results, strict=True):
        assert len({r["checksum"] for r in ranks}) == 1, case
        assert all(abs(a - b) <= 1e-5 * max(1.0, abs(b)) for a, b in zip(ranks[0]["losses"], want, strict=True)), case


# ---- the double catches what it must, and each rule is what catches it -----------------------------
def _recv_then_send(got: list) -> bool:
    return all("deadlock" in m and "recv #0" in m and "nccl_cases.py" in m for m in got)


SELF_TESTS: dict[str, tuple[str, dict[str, Any], dict[str, str], float, Callable[[Any], bool]]] = {
    # rule: (rank body, its kwargs, env, the group's timeout, what the double must report)
    "deadlock": ("recv_then_send", {}, {"ZEN_RULES_DEADLOCK_S": "3"}, 20.0, _recv_then_send),
    "refuse": ("refused", {}, {}, 20.0, lambda got: all("unequal sizes" in g["unequal_allgather"] for g in got)),
    "completion": ("completes_with_peers", {}, {}, 20.0,
                   lambda got: got[0] == {"early": False, "late": True}),
    "poison": ("read_before_wait", {}, {}, 20.0, lambda got: all(g["before_nan"] for g in got)),
    "rank_poison": ("per_rank_poison", {}, {}, 20.0,
                    lambda got: not any(g["agree"] for g in got) and all(g["after"] == [7] * 8 for g in got)),
    "unwritten": ("written_before_wait", {"what": "input"}, {}, 20.0,
                  lambda got: all("input buffer" in m and "written" in m for m in got)),
    "watchdog": ("outlives_group_timeout", {}, {}, 4.0,
                 lambda got: isinstance(got, str) and "watchdog" in got and "ran past the group's timeout" in got),
    "one_stream": ("interleaved_communicators", {}, {"ZEN_RULES_ONE_STREAM": "1", "ZEN_RULES_DEADLOCK_S": "3"}, 20.0,
                   lambda got: all("deadlock" in m for m in got)),
}


def _self_test(rule: str, disabled: bool) -> bool:
    target, kwargs, env, pg_timeout_s, reported = SELF_TESTS[rule]
    env = {**env, "ZEN_RULES_DISABLE": rule if disabled else ""}
    try:
        got: Any = _spawn(target, 2, kwargs, env=env, pg_timeout_s=pg_timeout_s, timeout_s=60)
    except zen.ZenCommError as exc:  # a rank torn down (the watchdog), or hung
        got = str(exc)
    try:
        return bool(reported(got))
    except (KeyError, TypeError, IndexError):  # not what the rule reports at all
        return False


CROWDED_START_S = 10.0  # a group timeout shorter than this may run out while ranks of other launches start
OTHER_SELF_TESTS: dict[str, tuple[str, Callable[[], Any]]] = {  # key: (its test, its launch)
    "output_written": ("test_double_reports_an_output_written_before_its_wait",
                       lambda: _spawn("written_before_wait", 2, {"what": "output"})),
    "pairs": ("test_double_pairs_sends_and_receives_in_order", lambda: _spawn("send_then_recv_pairs", 2)),
    "refused": ("test_double_refuses_what_nccl_lacks", lambda: _spawn("refused", 2)),
}


@pytest.fixture(scope="module")
def self_tests(request: pytest.FixtureRequest) -> dict[tuple[str, bool] | str, Any]:
    """The selected self-tests' launches, three at a time: a self-test's ranks mostly wait (on a peer's sleep, the
    double's deadlock timer or its watchdog), so the waits overlap. One whose group timeout is short runs alone
    first (its ranks' start-up must not outlast that timeout)."""
    wanted = [(rule, False) for rule in selected(request, "test_double_reports_its_rule", "rule")]
    wanted += [(rule, True) for rule in selected(request, "test_double_misses_the_bug_with_its_rule_disabled", "rule")]
    jobs: dict[Any, Callable[[], Any]] = {key: functools.partial(_self_test, *key) for key in wanted}
    alone = [key for key in jobs if SELF_TESTS[key[0]][3] < CROWDED_START_S]
    done = {key: at_once({key: jobs.pop(key)}, workers=1)[key] for key in alone}
    jobs.update({key: launch for key, (test, launch) in OTHER_SELF_TESTS.items() if selected(request, test)})
    return {**done, **at_once(jobs, workers=3)}


@pytest.mark.parametrize("rule", sorted(SELF_TESTS))
def test_double_reports_its_rule(rule: str, self_tests: dict[tuple[str, bool], Any]) -> None:
    assert value(self_tests[(rule, False)]) is True, rule


@pytest.mark.parametrize("rule", sorted(SELF_TESTS))
def test_double_misses_the_bug_with_its_rule_disabled(rule: str, self_tests: dict[tuple[str, bool], Any]) -> None:
    """The broken variant of each rule (ZEN_RULES_DISABLE): the same self-test then fails, so the rule is what
    catches its bug."""
    assert value(self_tests[(rule, True)]) is False, rule


def test_double_reports_an_output_written_before_its_wait(self_tests: dict[tuple[str, bool] | str, Any]) -> None:
    for m in value(self_tests["output_written"]):
        assert "output buffer" in m and "written before its wait" in m, m


def test_double_pairs_sends_and_receives_in_order(self_tests: dict[tuple[str, bool] | str, Any]) -> None:
    assert value(self_tests["pairs"]) == [[1.0] * 4, [0.0] * 4]


def test_double_refuses_what_nccl_lacks(self_tests: dict[tuple[str, bool] | str, Any]) -> None:
    for got in value(self_tests["refused"]):
        assert "any source" in got["recv_anysource"], got
        assert "sparse" in got["sparse"], got
        assert "issued" in got["mismatch"], got
