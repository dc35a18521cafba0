"""zen.fsdp under NCCL's rules, proven on CPU: the FSDP2 path's exchange on the NCCL-rules test double
(tests/nccl_rules.py: NCCL's ordering, equal sizes, completion at enqueue, poisoned outputs until the wait) with
Zen's accelerator code path (the row counts read with the header round, no bounded single round). Reference: FSDP's
own reduce-scatter on gloo (the double has no reduce-scatter of its own)."""

from __future__ import annotations

import pytest

from harness.launch import spawn

from .helpers import FP32_BOUND, FSDP_SHAPES, assert_params_equal

pytestmark = [pytest.mark.nccl_rules, pytest.mark.slow]
EMULATE = {"ZEN_EMULATE_ACCELERATOR": "1"}


@pytest.mark.parametrize("P", [2, 4])
def test_fsdp_path_matches_fsdp_default_under_nccl_rules(P: int) -> None:
    cases = [{"scheme": s, **shape} for shape in FSDP_SHAPES.values() for s in ("zen", "dense")]
    cases.append({"scheme": "zen", "compress": "dgc", **FSDP_SHAPES["padded"]})
    refs = [{"scheme": "fsdp", **shape} for shape in FSDP_SHAPES.values()]  # FSDP's own, once per shape
    of = [None if c.get("compress") else refs.index({**c, "scheme": "fsdp"}) for c in cases]
    reference = spawn("tests.fsdp_cases:cases", P, {"cases": refs}, timeout_s=600)
    ruled = spawn("tests.fsdp_cases:cases", P, {"cases": cases}, backend="ncclrules", timeout_s=900,
                  env=lambda r: EMULATE)
    for rank in range(P):
        for i, case in enumerate(cases):
            got = ruled[rank][i]
            assert all(c["sent"] == c["expected"] for c in got["calls"]), (case, got["calls"])
            if case.get("compress"):
                assert_params_equal(ruled[0][i]["params"], got["params"], 0.0, f"{case} rank {rank}")
                continue
            bound = 0.0 if P == 2 else FP32_BOUND
            assert_params_equal(reference[rank][of[i]]["params"], got["params"], bound, str(case))
