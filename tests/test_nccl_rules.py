"""Zen under NCCL's rules, proven on CPU: every scheme, the DDP hook, two-level sync and every compressor run on
the NCCL-rules test double (tests/nccl_rules.py: gloo underneath, NCCL's ordering, equal-size all-gathers,
completion at enqueue with poisoned outputs until the wait, counted host reads) with Zen's accelerator code
path, at world sizes 2, 3, 4 and 8; and the double itself catches what it must."""

from __future__ import annotations

from typing import Any

import pytest

import zen
from harness.launch import spawn
from zen.compress import compressors

from .cases import CASES

pytestmark = [pytest.mark.nccl_rules, pytest.mark.slow]  # ranks in processes of their own
EMULATE = {"ZEN_EMULATE_ACCELERATOR": "1"}
WORLD_SIZES = [2, 3, 4, 8]


def _spawn(target: str, P: int, kwargs: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> list:
    return spawn(f"tests.nccl_cases:{target}", P, kwargs or {}, backend="ncclrules", timeout_s=900,
                 env=lambda r: {**EMULATE, **(env or {})})


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


@pytest.mark.parametrize(("scheme", "sparse"), [("zen", False), ("zen", True),
                                                *((s, False) for s in zen.schemes() if s != "zen")])
def test_hook_host_reads_per_bucket(scheme: str, sparse: bool) -> None:
    """A steady-state step's backward reads device data on the host at most once per exchange round, as the
    double counts (every thread) and as the communicator counts."""
    for got in _spawn("hook_reads", 4, {"scheme": scheme, "sparse": sparse}):
        assert got["reads"] <= got["rounds"], got
        assert got["counted"] <= got["rounds"], got


# ---- the double catches what it must --------------------------------------------------------------
def test_double_reports_recv_then_send_as_a_deadlock() -> None:
    messages = _spawn("recv_then_send", 2, env={"ZEN_RULES_DEADLOCK_S": "3"})
    for m in messages:
        assert "deadlock" in m and "recv #0" in m and "nccl_cases.py" in m, m


def test_double_pairs_sends_and_receives_in_order() -> None:
    assert _spawn("send_then_recv_pairs", 2) == [[1.0] * 4, [0.0] * 4]


def test_double_poisons_an_output_read_before_the_wait() -> None:
    for got in _spawn("read_before_wait", 2):
        assert got == {"before_nan": True, "after": [2.0] * 5, "completed_at_enqueue": True}


def test_double_refuses_what_nccl_lacks() -> None:
    for got in _spawn("refused", 2):
        assert "unequal sizes" in got["unequal_allgather"], got
        assert "any source" in got["recv_anysource"], got
        assert "sparse" in got["sparse"], got
        assert "issued" in got["mismatch"], got
