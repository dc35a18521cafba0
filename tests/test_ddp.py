"""The DDP hook on real gloo ranks: asynchronous and routed (embedding rows through the scheme, the rest
dense), it trains exactly like DDP's own allreduce under DDP's options, and fails loudly on every rank."""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest
import torch

import zen
from harness.launch import spawn
from zen.comm.base import Pending
from zen.core import SyncConfig, Synchronizer
from zen.ddp import StepRecord, ZenHookState
from zen.ddp.worker import Fault, all_settled, settle
from zen.device import Clock

TOLERANCE = 1e-5
SCHEMES = zen.schemes()


def _close(a: list[float], b: list[float]) -> bool:
    return all(abs(x - y) <= TOLERANCE * max(1.0, abs(y)) for x, y in zip(a, b, strict=True))


def _run(P: int, cases: list[dict]) -> list[list[dict]]:
    """Per case, every rank's result; parameters must agree across ranks."""
    per_rank = spawn("tests.ddp_cases:variants", P, {"cases": cases}, timeout_s=900)
    results = list(zip(*per_rank, strict=True))
    for case, ranks in zip(cases, results, strict=True):
        assert len({r["checksum"] for r in ranks}) == 1, f"{case}: parameters differ across ranks"
    return [list(r) for r in results]


EVERY_SCHEME = [{"scheme": "ddp"}, *({"scheme": s, "sparse": sp} for s in SCHEMES for sp in (False, True)),
                {"scheme": "zen", "hook": {"asynchronous": False}}, {"scheme": "zen", "hook": {"check_every": 0}}]
OPTIONS = [{"ddp": {"gradient_as_bucket_view": True}}, {"ddp": {"static_graph": True}}, {"accumulate": 3},
           {"ddp": {"find_unused_parameters": True}, "branch": True}, {"ddp": {"bucket_cap_mb": 0.001}}]
WITH_OPTIONS = [case for extra in OPTIONS for case in
                [{"scheme": "ddp", **extra}, *({"scheme": s, "sparse": sp, **extra}
                                              for s in ("zen", "agsparse") for sp in (False, True))]]


@pytest.fixture(scope="module")
def trained() -> Callable[[int], dict[str, list[list[dict]]]]:
    """One launch per world size for this module's training cases: EVERY_SCHEME's on 1, 3 and 4 ranks and
    WITH_OPTIONS' on 3 (one process group serves both tests there)."""
    @functools.cache
    def launch(P: int) -> dict[str, list[list[dict]]]:
        options = WITH_OPTIONS if P == 3 else []
        results = _run(P, EVERY_SCHEME + options)
        return {"every_scheme": results[:len(EVERY_SCHEME)], "options": results[len(EVERY_SCHEME):]}

    return launch


@pytest.mark.slow
@pytest.mark.parametrize("P", [1, 3, 4])
def test_every_scheme_trains_like_ddp_allreduce(P: int, trained: Callable[[int], dict[str, list[list[dict]]]]) -> None:
    """Dense and sparse (COO) embeddings, every scheme, async and in the hook call: DDP's loss curve."""
    cases = EVERY_SCHEME
    results = trained(P)["every_scheme"]
    reference = results[0][0]["losses"]
    assert reference[-1] < reference[0]
    for case, ranks in zip(cases[1:], results[1:], strict=True):
        assert _close(ranks[0]["losses"], reference), case


@pytest.mark.slow
def test_ddp_options_keep_the_hook_lossless(trained: Callable[[int], dict[str, list[list[dict]]]]) -> None:
    """gradient_as_bucket_view, static_graph, no_sync accumulation and find_unused_parameters: each as DDP's
    own allreduce does it, for dense and sparse embeddings."""
    cases = WITH_OPTIONS
    results = trained(3)["options"]
    reference = None
    for case, ranks in zip(cases, results, strict=True):
        if case["scheme"] == "ddp":
            reference = ranks[0]["losses"]
            continue
        assert reference is not None and _close(ranks[0]["losses"], reference), case


@pytest.mark.slow
def test_builtin_allreduce_of_sparse_gradients_on_gloo_warns() -> None:
    """DDP's own all-reduce of COO gradients over gloo corrupts the heap now and then (torch 2.13.0+cpu): `ddp`
    says so where the model has sparse embeddings, and only there."""
    sparse, dense = spawn("tests.ddp_cases:builtin_warnings_of", 1, {"cases": [True, False]})[0]
    assert len(sparse) == 1 and "corrupted the heap" in sparse[0] and dense == []


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "expect"), [("nan", "non-finite"), ("frozen", "ZenCommError")])
def test_failures_reach_every_rank_through_the_futures(kind: str, expect: str) -> None:
    """A NaN with nonfinite="raise" is a ZenInputError on every rank; a frozen peer makes the others' backward
    raise ZenCommError after the hook's timeout, not hang."""
    out = spawn("tests.ddp_cases:failing_step", 3, {"kind": kind, "timeout_s": 3.0}, timeout_s=120)
    waiting = [0, 2] if kind == "frozen" else [0, 1, 2]
    for r in waiting:
        assert expect in out[r], (r, out[r])
        if kind == "frozen":
            assert float(out[r].split(" after ")[1].split("s")[0]) < 20, out[r]


@pytest.mark.slow
def test_nonfinite_values_pass_by_default() -> None:
    """As DDP's allreduce: an Inf on one rank reaches every rank's gradient (GradScaler skips the step)."""
    assert spawn("tests.ddp_cases:failing_step", 2, {"kind": "inf_passes"}, timeout_s=120) == ["passed", "passed"]


def test_hook_state_checks_its_settings() -> None:
    with pytest.raises(zen.ZenInputError, match="unknown scheme"):
        ZenHookState(scheme="nope")
    with pytest.raises(zen.ZenInputError, match="nonfinite"):
        ZenHookState(nonfinite="ignore")
    with pytest.raises(zen.ZenInputError, match="check_every"):
        ZenHookState(check_every=-1)
    with pytest.raises(zen.ZenInputError, match="timeout_s"):
        ZenHookState(timeout_s=0)
    with pytest.raises(zen.ZenInputError, match="lanes"):
        ZenHookState(lanes=0)
    state = ZenHookState(timeout_s=5.0, sparse_params=torch.nn.Embedding(3, 2))
    assert state.__getstate__()["_runtime"] is None  # no lanes, groups or threads in a pickle


def test_every_part_gets_its_own_scheme_instance() -> None:
    """zen's measured gamma and its timed BP-or-HC trial are per-size state of one tensor: two tables of one
    shape on one lane must not share them (their trial compared one table's BP with the other's HC)."""
    syncer = Synchronizer(SyncConfig(), comm=None)  # type: ignore[arg-type]  # no group needed
    items, users = syncer.scheme_for("", (1,)), syncer.scheme_for("", (2,))
    assert items is not users and syncer.scheme_for("", (1,)) is items
    assert syncer.scheme_for("allreduce", (1,)) is not items


def test_step_record_busy_time_is_the_union_of_spans() -> None:
    def span(a: float, b: float) -> Clock:
        clock = Clock(torch.device("cpu"))
        clock._start, clock._end = a, b
        return clock

    rec = StepRecord(spans=[span(0.0, 1.0), span(0.5, 2.0), span(3.0, 4.0), span(3.5, 3.6)])
    assert rec.busy_s() == pytest.approx(3.0)
    assert StepRecord().busy_s() == 0.0


def test_input_check_runs_around_the_bucket_rebuild_then_periodically() -> None:
    def due(state: ZenHookState) -> list[bool]:
        out = []
        for i in range(6):
            state.iteration = i
            out.append(state.check_due())
        return out

    assert due(ZenHookState(check_every=4)) == [True, True, False, False, True, False]
    assert due(ZenHookState(check_every=0)) == [True, True, False, False, False, False]
    assert all(due(ZenHookState(check_every=0, nonfinite="raise")))
    assert not any(due(ZenHookState(validate=False)))


def _failing_later() -> tuple[torch.futures.Future, torch.futures.Future]:
    """(source, derived): `derived` fails with a C++ error (as a timed-out collective's future) once
    `source` completes."""
    source = torch.futures.Future()
    return source, source.then(lambda _: 1 / 0)


def test_a_bucket_fails_only_after_all_its_work_in_flight_has_ended() -> None:
    """A failed dense part fails the bucket's future, but only once every other tracked operation has ended
    too (nothing of the hook may still run when backward raises and the process exits): `collect_all` alone
    would stop at the first failure."""
    fault = Fault()
    source, failing = _failing_later()
    other = fault.track(torch.futures.Future())  # e.g. another lane's job, still running
    done: torch.futures.Future = torch.futures.Future()
    settle(done, "result", [fault.track(Pending(torch.zeros(1), future=failing))], fault)
    source.set_result(None)
    assert not done.done() and fault.failure is not None
    other.set_result(None)
    assert done.done()
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        done.wait()
    later: torch.futures.Future = torch.futures.Future()
    fault.fail(later, RuntimeError("nothing in flight: at once"))
    assert later.done()


def test_all_settled_waits_for_every_future_failed_or_not() -> None:
    source, failing = _failing_later()
    ok: torch.futures.Future = torch.futures.Future()
    both = all_settled([failing, ok])
    source.set_result(None)
    assert failing.done() and not both.done()
    ok.set_result(1)
    assert both.done()
