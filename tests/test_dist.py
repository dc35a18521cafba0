"""Real torch.distributed (gloo) processes: lossless, identical on all ranks, clear errors."""

from __future__ import annotations

import pytest

import zen
from harness.launch import spawn

from .cases import CASES

SCHEMES = zen.schemes()


@pytest.mark.parametrize("P", [1, 2, 3, 4, 8])
def test_lossless_real_gloo(P: int) -> None:
    dtypes = ["float32", "bfloat16"] if P in (3, 4) else ["float32"]
    cases = sorted(CASES) if P <= 4 else ["random", "empty_ranks", "edges", "coo"]
    reports = spawn("tests.dist_cases:lossless_all", P, {"schemes": SCHEMES, "cases": cases, "dtypes": dtypes},
                    timeout_s=600)
    for key, (ok, digest) in reports[0].items():
        assert ok, f"P={P} {key}: wrong sum on rank 0"
        for r in range(1, P):
            assert reports[r][key][0], f"P={P} {key}: wrong sum on rank {r}"
            assert reports[r][key][1] == digest, f"P={P} {key}: rank {r} differs from rank 0"


@pytest.mark.parametrize("kind", ["shape", "dtype", "nan", "inf", "scheme_mismatch", "index"])
def test_bad_input_raises_on_every_rank(kind: str) -> None:
    messages = spawn("tests.dist_cases:bad_input", 3, {"kind": kind, "scheme": "zen"}, timeout_s=120)
    for m in messages:
        assert m != "no error", f"{kind}: a rank did not raise"
    assert "rank 1" in messages[0] or "rank 0" in messages[0]


def test_dead_peer_is_an_error_not_a_hang() -> None:
    for scheme in ("zen-bp", "allreduce", "zen-hc"):
        out = spawn("tests.dist_cases:dead_peer", 3, {"scheme": scheme, "timeout_s": 10}, timeout_s=120)
        assert out[1] == "left"
        for m in (out[0], out[2]):
            assert m.startswith("error after"), m


def test_launch_calms_gloo_event_loop() -> None:
    """Ranks spawned by harness.launch run gloo's event loop under SCHED_BATCH (no wake-up preemption of a
    rank holding a gloo lock); ZEN_GLOO_BATCH=0 keeps the default policy."""
    assert spawn("tests.dist_cases:gloo_loop", 2) == ["batch", "batch"]
    assert spawn("tests.dist_cases:gloo_loop", 2, env=lambda r: {"ZEN_GLOO_BATCH": "0"}) == ["default", "default"]
