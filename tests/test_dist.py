"""Real torch.distributed (gloo) processes: lossless, identical on all ranks, clear errors."""

from __future__ import annotations

import pytest

import zen
from harness.launch import spawn

from .cases import CASES

SCHEMES = zen.schemes()
pytestmark = pytest.mark.slow  # every test here runs ranks in processes of their own


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


BAD_INPUTS = ["shape", "dtype", "nan", "inf", "scheme_mismatch", "index"]
KEPT_RESULTS = ["zen-hc", "agsparse", "zen-bp"]


@pytest.fixture(scope="module")
def bad_input_messages() -> list[dict[str, str]]:
    """Every kind of bad input in one launch of 3 ranks (one process group for all)."""
    return spawn("tests.dist_cases:bad_inputs", 3, {"kinds": BAD_INPUTS, "scheme": "zen"}, timeout_s=240)


@pytest.fixture(scope="module")
def kept_results() -> list[dict[str, bool]]:
    return spawn("tests.dist_cases:kept_results_of", 2, {"schemes": KEPT_RESULTS}, timeout_s=240)


@pytest.mark.parametrize("kind", BAD_INPUTS)
def test_bad_input_raises_on_every_rank(kind: str, bad_input_messages: list[dict[str, str]]) -> None:
    messages = [per_rank[kind] for per_rank in bad_input_messages]
    for m in messages:
        assert m != "no error", f"{kind}: a rank did not raise"
    assert "rank 1" in messages[0] or "rank 0" in messages[0]


def test_dead_peer_is_an_error_not_a_hang() -> None:
    for scheme in ("zen-bp", "allreduce", "zen-hc"):
        out = spawn("tests.dist_cases:dead_peer", 3, {"scheme": scheme, "timeout_s": 10}, timeout_s=120)
        assert out[1] == "left"
        for m in (out[0], out[2]):
            assert m.startswith("error after"), m


@pytest.mark.parametrize("scheme", KEPT_RESULTS)
def test_results_that_are_received_messages_survive_later_calls(scheme: str, kept_results: list[dict[str, bool]]
                                                                 ) -> None:
    """The communicator's pooled wire buffers (zen.comm.pool) are never handed out while a result views them."""
    assert [per_rank[scheme] for per_rank in kept_results] == [True, True]


def test_gathered_messages_land_aligned_without_copies() -> None:
    """Each peer's message lands on its own 64-byte line of the receive buffer: values after an odd-sized message
    are views there (unpack copies only what is misaligned)."""
    assert spawn("tests.dist_cases:aligned_gather", 3, timeout_s=120) == [[True, True, True]] * 3


def test_bounded_rounds_move_the_same_messages_in_one_round() -> None:
    """Where the input check announced every rank's rows, exchanges, all-gathers and pushes travel with their
    headers in front (one round instead of two): the same messages, the same bytes counted; a sender over its bound
    raises before sending (gloo would abort the receiving process)."""
    for report in spawn("tests.dist_cases:bounded_rounds", 3, timeout_s=120):
        assert report["same"] and report["bytes"], report
        assert report["rounds"][1] < report["rounds"][0], report
        assert "exceeds its bound" in report["refused"], report


@pytest.mark.parametrize("P", [3, 4])
def test_agreed_sizes_take_one_round_without_the_check(P: int) -> None:
    """Between the hook's checks (sizes agreed, no counts announced) a row exchange is bounded by the tensor's rows:
    one round on gloo instead of a header round first, and the same sums, bit for bit, on every rank. Where zen's
    plan is the dense all-reduce (every row full), there is no row exchange to bound: as many rounds either way."""
    schemes = ["zen-hc", "zen-bp", "zen", "agsparse"]
    cases = ["random", "empty_ranks", "full", "matrix"]
    reports = spawn("tests.dist_cases:agreed_sizes_bound_rows", P, {"schemes": schemes, "cases": cases},
                    timeout_s=300)
    for key, (_, _, one, two, plan) in reports[0].items():
        for r, report in enumerate(reports):
            assert report[key][:2] == (True, True), f"P={P} {key}: rank {r} {report[key]}"
        rounds = f"P={P} {key}: {one} rounds bounded, {two} with headers"
        assert one < two or (plan == "allreduce" and one == two), rounds
        assert plan != "allreduce" or key == "zen/full", key


def test_launch_calms_gloo_event_loop() -> None:
    """Ranks spawned by harness.launch run gloo's event loop under SCHED_BATCH (no wake-up preemption of a
    rank holding a gloo lock); ZEN_GLOO_BATCH=0 keeps the default policy."""
    assert spawn("tests.dist_cases:gloo_loop", 2) == ["batch", "batch"]
    assert spawn("tests.dist_cases:gloo_loop", 2, env=lambda r: {"ZEN_GLOO_BATCH": "0"}) == ["default", "default"]


def test_stage_times_script_times_each_stage(capsys: pytest.CaptureFixture[str]) -> None:
    """scripts/stage_times.py: a row per stage a scheme's call enters (BP's partition, server and pull; HC's
    merge), wall, CPU and page faults for every rank, the stages inside the call's time; an unknown scheme exits 2."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import stage_times

    with pytest.raises(SystemExit) as refused:
        stage_times.main(["--schemes", "nope"])
    assert refused.value.code == 2
    assert stage_times.main(["--schemes", "zen-bp,zen-hc", "-n", "4", "--numel", "2^14", "--calls", "2",
                             "--warmup", "1"]) == 0
    text = capsys.readouterr().out
    bp, hc = text.split("== zen-bp")[1].split("== zen-hc")
    rows = {line.split()[0]: line for line in bp.splitlines() if line.strip()}
    assert {"extract", "partition", "all-to-all", "server", "call"} <= set(rows)
    assert "merge" in hc and "partition" not in hc  # 4 ranks: HC merges after its first of two rounds
    cells = [float(v) for v in rows["call"].replace("/", " ").split()[1:]]
    assert len(cells) == 12 and all(v >= 0 for v in cells)  # wall / CPU / page faults for each of the 4 ranks


def test_best_of_all_judges_zen_against_the_fastest_other_scheme(tmp_path, capsys: pytest.CaptureFixture[str]
                                                                   ) -> None:
    """scripts/best_of_all.py: per cell zen's median against the fastest other registered scheme's, pooled over the
    cell's two launches (schemes in order and reversed); a cell passes within 1.02x or where the 25th-75th
    percentiles overlap; a bad rate exits 2."""
    import csv
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import best_of_all

    def row(scheme: str, times: list[float]) -> dict:
        return {"scheme": scheme, "times_ms": times, "time_ms_median": sorted(times)[len(times) // 2],
                "choice": "bp" if scheme == "zen" else None, "correct": True}

    apart = [row("zen", [12, 12, 12, 12, 12]), row("agsparse", [10, 10, 10, 10, 10]), row("allreduce", [90] * 5)]
    close = [row("zen", [10.1] * 5), row("agsparse", [10, 10, 10, 10, 10])]
    spread = [row("zen", [9, 10, 11, 12, 13]), row("sparcml", [8, 9, 10, 11, 12])]
    assert [best_of_all.judge(c)["passes"] for c in (apart, close, spread)] == [False, True, True]
    assert best_of_all.judge(apart)["best"] == "agsparse"
    late = [row("zen", [14, 14, 14, 14, 14]), row("agsparse", [10, 10, 10, 10, 10])]  # zen ran last, then first
    early = [row("agsparse", [14, 14, 14, 14, 14]), {**row("zen", [10, 10, 10, 10, 10]), "choice": "ag"}]
    both = {r["scheme"]: r for r in best_of_all.pooled([late, early])}
    assert both["zen"]["time_ms_median"] == both["agsparse"]["time_ms_median"] == 12.0
    assert both["zen"]["choice"] == "bp/ag" and len(both["zen"]["times_ms"]) == 10
    with pytest.raises(SystemExit) as refused:
        best_of_all.main(["--bandwidths", "1zz"])
    assert refused.value.code == 2
    with pytest.raises(SystemExit) as refused:
        best_of_all.main(["--ranks", "4,6", "--ranks-per-node", "4"])
    assert refused.value.code == 2
    out = tmp_path / "cells.csv"
    best_of_all.main(["--ranks", "3", "--sizes", "12", "--densities", "0.05", "--patterns", "zipf", "--repeats", "4",
                      "--csv", str(out)])
    (cell,) = list(csv.DictReader(out.open()))
    assert cell["correct"] == "True" and cell["best"] in best_of_all.rivals() and cell["zen_plan"]
    assert "| 3 | loopback | 2^12 | 0.05 | zipf |" in capsys.readouterr().out
    best_of_all.main(["--ranks", "4", "--ranks-per-node", "2", "--sizes", "12", "--densities", "0.05", "--patterns",
                      "zipf", "--repeats", "4", "--csv", str(out)])
    (cell,) = list(csv.DictReader(out.open()))
    assert cell["correct"] == "True" and cell["ranks"] == "2 x 2"
    assert "| 2 x 2 | loopback | 2^12 | 0.05 | zipf |" in capsys.readouterr().out
