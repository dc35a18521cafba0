"""Every registered scheme returns the float64 dense sum, bit-identical on all virtual ranks."""

from __future__ import annotations

import contextlib
import time

import pytest
import torch

import zen
from harness.reference import matches_reference, reference_sum
from zen import native
from zen.encodings import encodings

from .cases import CASES
from .helpers import check_lossless

SCHEMES = zen.schemes()
ENCODINGS = encodings()


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("P", [1, 3, 4])
def test_lossless_fp32(scheme: str, case: str, P: int) -> None:
    check_lossless(scheme, case, P, torch.float32)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("case", ["random", "edges", "coo", "matrix", "full"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_lossless_low_precision(scheme: str, case: str, dtype: torch.dtype) -> None:
    check_lossless(scheme, case, 5, dtype)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("P", [2, 5, 8, 16, 64])
def test_lossless_world_sizes(scheme: str, P: int) -> None:
    for case in ("random", "empty_ranks", "edges"):
        check_lossless(scheme, case, P, torch.float32)


@pytest.mark.parametrize("pull", ENCODINGS)
@pytest.mark.parametrize("P", [1, 3, 8])
def test_bp_pull_encodings(pull: str, P: int) -> None:
    for case in ("random", "full", "coo", "edges"):
        check_lossless("zen-bp", case, P, torch.float32, pull=pull)


@pytest.mark.parametrize("P", [2, 3, 8])
def test_zen_selector_both_paths(P: int) -> None:
    for choice in ("bp", "hc"):
        res = check_lossless("zen", "random", P, torch.float32, choice=choice, warmup=1)
        assert res.stats[0].choice == choice


def test_repeated_calls_reuse_state() -> None:
    """The selector decides after measuring; later calls stay lossless on the chosen path."""
    check_lossless("zen", "disjoint", 4, torch.float32, warmup=3)
    check_lossless("zen", "identical", 4, torch.float32, warmup=3)


def test_selector_picks_hc_for_disjoint_tiny_density_and_bp_for_overlap() -> None:
    from harness.bench.patterns import make_gradient

    P = 16
    disjoint = [make_gradient("disjoint", 1 << 18, 0.0005, r, P, seed=1) for r in range(P)]
    assert zen.simulate("zen", disjoint, warmup=2).stats[0].choice == "hc"  # its unions' codes are shorter
    overlapping = [make_gradient("zipf", 1 << 18, 0.01, r, P, seed=1) for r in range(P)]
    assert zen.simulate("zen", overlapping, warmup=2).stats[0].choice == "bp"


class _Slowed:
    """A path whose calls first wait the given delays (then none); everything else is the path's."""

    def __init__(self, path: object, waits: list[float]) -> None:
        self.path, self.waits = path, iter(waits)

    def __call__(self, *args: object) -> None:
        time.sleep(next(self.waits, 0.0))
        self.path(*args)

    def __getattr__(self, name: str) -> object:
        return getattr(self.path, name)


def _trial_choices(delays: dict[str, list[float]], late: dict[int, list[float]], calls: int = 5,
                   hc_ids: str = "gaps") -> list[tuple[list[str], list[str]]]:
    """`calls` zen calls on 2 clocked simulated ranks (as a real backend: the selector times its trial), its
    paths slowed by `delays` on every rank, rank r arriving late[r] seconds late at its first calls; every
    call must stay lossless. Returns each rank's choices per call and its kept choices."""
    from zen.api import sync
    from zen.comm.sim import SimComm, SimGroup
    from zen.registry import make_scheme

    class Clocked(SimComm):
        clocked = True

    P = 2
    tensors = [CASES["random"](r, P, torch.float32) for r in range(P)]
    total, magnitude = reference_sum(tensors)
    group = SimGroup(P, timeout_s=60)

    def rank_main(r: int) -> list[str]:
        scheme = make_scheme("zen", hc_ids=hc_ids, trial_iters=2)  # two timed calls of each HC, as the cases list
        for name in delays:
            setattr(scheme, name, _Slowed(getattr(scheme, name), delays[name]))
        comm, got, arrivals = Clocked(group, r, tensors[r].device), [], iter(late.get(r, []))
        for _ in range(calls):
            time.sleep(next(arrivals, 0.0))
            out, stats = sync(scheme, tensors[r], comm, validate=False)  # as the hook after its first steps:
            assert matches_reference(out, total, magnitude, P)  # the scheme's first exchange meets a late rank
            got.append(stats.choice)
        return got, list(scheme.choices.values())

    return group.run(rank_main)


def test_selector_trial_keeps_the_fastest_call_of_each() -> None:
    """On a clocked backend zen times two BP and two HC calls and compares the fastest of each: one slow HC
    call (a busy core) does not settle the choice."""
    for choices, _ in _trial_choices({"bp": [0.20, 0.10], "hc": [0.30, 0.02]}, {}):  # one call each: BP
        assert choices == ["bp", "bp", "hc", "hc", "hc"]


def test_selector_trial_does_not_count_waiting_for_a_late_rank() -> None:
    """A rank's call time includes waiting for the others to arrive (a DDP hook: backward passes apart), which
    no path changes: the trial compares each path at the rank where it is fastest, the one that waited least.
    Here rank 1 is late for both BP calls; BP itself is the faster path."""
    for choices, _ in _trial_choices({"bp": [], "hc": [0.10, 0.10]}, {1: [0.30, 0.30]}):
        assert choices[:4] == ["bp", "bp", "hc", "hc"] and choices[4] in ("bp", "bp-range")  # BP's plan: the
        # partitions predicted faster (at 2 ranks and 997 rows, which is luck of the draw)


def test_selector_times_hc_with_plain_ids_too() -> None:
    """hc_ids="auto" (the default): after the gap-coded HC calls as many with plain COO ids are timed; where
    the coding costs more than it saves (here: slowed), HC keeps plain ids; where it does not, gaps."""
    slow_bp = [0.30, 0.30]
    for choices, kept in _trial_choices({"bp": slow_bp, "hc": [0.10, 0.10, 0.10]}, {}, calls=7, hc_ids="auto"):
        assert choices == ["bp", "bp", "hc", "hc", "hc-coo", "hc-coo", "hc-coo"] and kept == ["hc-coo"]
    for _, kept in _trial_choices({"bp": slow_bp, "hc_coo": [0.10, 0.10]}, {}, calls=7, hc_ids="auto"):
        assert kept == ["hc"]


@pytest.mark.parametrize("pull", ENCODINGS)
def test_bp_compact_and_dense_paths_agree(pull: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """BP's compact path (sum over the received ids, encode from them; forced on) and its dense path
    (sum into `out`, scan S_r; forced on) give the same outputs and bytes, including rows whose sum
    cancels to exactly zero."""
    import zen.algorithms.bp
    from harness.bench.patterns import make_gradient

    P = 4
    tensors = [make_gradient("random", 4099, 0.02, r, P, seed=3) for r in range(P)]
    tensors[1] = -tensors[0]  # rank 0's rows cancel, except where rank 1 is zeroed
    tensors[1][::2] = 0
    tensors[2][0] = 1.0  # row 0 too
    runs = []
    for ratio in (0, 10**9):
        monkeypatch.setattr(zen.algorithms.bp, "COMPACT_RATIO", ratio)
        for name in ("zen-bp", "zen"):
            res = zen.simulate(name, tensors, seed=5, warmup=1, pull=pull)
            total, magnitude = reference_sum(tensors)
            assert all(matches_reference(o, total, magnitude, P) for o in res.outputs)
            assert all(torch.equal(o, res.outputs[0]) for o in res.outputs)
            runs.append((res.outputs[0], res.phases))
    union = int(torch.stack([t != 0 for t in tensors]).any(0).sum())
    assert 0 < int((runs[0][0] != 0).sum()) < union  # some rows did cancel
    for (out, phases), (ref_out, ref_phases) in zip(runs[2:], runs[:2], strict=True):
        assert torch.equal(out, ref_out) and phases == ref_phases


@pytest.mark.parametrize("ids", ["coo", "gaps"])
@pytest.mark.parametrize("P", [2, 4, 5, 8])
def test_hc_union_survives_exact_cancellation(P: int, ids: str) -> None:
    """HC reads its union off the running sums; rows that cancel to exactly zero stay in the union
    (lossless, bytes as predicted) even when partners send them again in later rounds; with plain COO ids
    and gap-coded ones alike."""
    from harness.bench.patterns import make_gradient
    from zen.prediction import layout_and_sets, predict

    tensors = [make_gradient("random", 4099, 0.02, r, P, seed=3) for r in range(P)]
    tensors[1] = -tensors[0]  # cancels in the first round
    tensors[1][::3] = 0
    if P >= 4:  # the same rows come back from the partner block, cancelled there too
        tensors[2][tensors[0] != 0] = 1.0
        tensors[3][tensors[0] != 0] = -1.0
    res = zen.simulate("zen-hc", tensors, seed=7, ids=ids)
    total, magnitude = reference_sum(tensors)
    assert all(matches_reference(o, total, magnitude, P) and torch.equal(o, res.outputs[0]) for o in res.outputs)
    layout, sets = layout_and_sets(tensors, 7)
    for r, phases in enumerate(predict("zen-hc", sets, layout, ids=ids)):
        assert {p: v[r] for p, v in res.phases.items() if v[r]} == {p: v for p, v in phases.items() if v}


@pytest.mark.parametrize("P", [1, 3, 4, 5])
@pytest.mark.parametrize("kernels", ["native", "torch-op"])
def test_hc_gap_codes_follow_a_merged_union(P: int, kernels: str) -> None:
    """HC with gap-coded ids writes a merged union's codes into the room after its values (zen.comm.pool.after):
    the merge must leave its union in that room on the torch-op path too (it once returned a fresh tensor there,
    and the next round raised). Lossless, the same bits on every rank, bytes as predicted; `zen`'s HC plans too."""
    from harness.bench.patterns import make_gradient
    from zen.prediction import layout_and_sets, predict

    tensors = [make_gradient("random", 2**14, 0.02, r, P, seed=5) for r in range(P)]
    total, magnitude = reference_sum(tensors)
    layout, sets = layout_and_sets(tensors, 7)
    with native.disabled() if kernels == "torch-op" else contextlib.nullcontext():
        runs = [("zen-hc", zen.simulate("zen-hc", tensors, seed=7, warmup=2, ids="gaps"))]
        runs += [("zen", zen.simulate("zen", tensors, seed=7, warmup=2, choice="hc"))]
    for name, res in runs:
        assert all(matches_reference(o, total, magnitude, P) for o in res.outputs), (name, P)
        assert all(torch.equal(o, res.outputs[0]) for o in res.outputs), (name, P)
        for r, phases in enumerate(predict("zen-hc", sets, layout, ids="gaps")):
            assert {p: v[r] for p, v in res.phases.items() if v[r]} == {p: v for p, v in phases.items() if v}


def _cancelling(P: int) -> list[torch.Tensor]:
    """Random rows where rank 1 cancels most of rank 0's to exactly zero (and row 0, the last row)."""
    from harness.bench.patterns import make_gradient

    tensors = [make_gradient("random", 4099, 0.02, r, P, seed=11) for r in range(P)]
    if P > 1:
        tensors[1] = -tensors[0]
        tensors[1][::3] = 0
    tensors[0][0], tensors[0][-1] = 3.0, -2.0
    if P > 1:
        tensors[1][0], tensors[1][-1] = -3.0, 2.0
    return tensors


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("P", [1, 3, 4])
@pytest.mark.parametrize("kernels", ["native", "torch-op"])
def test_in_place_matches_out_of_place(scheme: str, P: int, kernels: str) -> None:
    """out = the input itself (DDP's buckets): the result is the same as into a separate buffer, bit for bit,
    with the same bytes, and rows whose sum cancels to exactly zero are zero on every rank; with the native
    kernels (one streamed write) and without them (only changed rows are cleared and written)."""
    with native.disabled() if kernels == "torch-op" else contextlib.nullcontext():
        _check_in_place(scheme, P)


def _check_in_place(scheme: str, P: int) -> None:
    for case in ("random", "edges", "empty_ranks", "full", "matrix", "cancelling"):
        tensors = _cancelling(P) if case == "cancelling" else [CASES[case](r, P, torch.float32) for r in range(P)]
        total, magnitude = reference_sum(tensors)
        apart = zen.simulate(scheme, tensors, seed=P)
        work = [t.clone() for t in tensors]
        inplace = zen.simulate(scheme, work, seed=P, outs=work)
        for r in range(P):
            assert inplace.outputs[r].data_ptr() == work[r].data_ptr()
            assert matches_reference(inplace.outputs[r], total, magnitude, P), f"{scheme} {case} rank {r}"
            assert torch.equal(inplace.outputs[r], apart.outputs[r]), f"{scheme} {case} rank {r}"
        assert inplace.phases == apart.phases


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("kernels", ["native", "torch-op"])
def test_divisor_is_the_sum_divided(scheme: str, dtype: torch.dtype, kernels: str) -> None:
    """A DDP hook's mean: divided while the result is written (fp32 on the native path) or in one more pass,
    the same bits as sum.div_(P), in place too."""
    with native.disabled() if kernels == "torch-op" else contextlib.nullcontext():
        _check_divisor(scheme, dtype)


def _check_divisor(scheme: str, dtype: torch.dtype) -> None:
    for P in (3, 4):
        tensors = [CASES["random"](r, P, dtype) for r in range(P)]
        summed = zen.simulate(scheme, tensors, seed=P)
        mean = zen.simulate(scheme, tensors, seed=P, divisor=P)
        work = [t.clone() for t in tensors]
        mean_in_place = zen.simulate(scheme, work, seed=P, outs=work, divisor=P)
        for s, m, w in zip(summed.outputs, mean.outputs, mean_in_place.outputs, strict=True):
            want = s.div(P).view(torch.uint8)
            assert torch.equal(m.view(torch.uint8), want) and torch.equal(w.view(torch.uint8), want), (scheme, P)


ROW_CASES = ("matrix", "coo", "empty_ranks", "all_empty", "cancelling_rows")


def _row_case(case: str, rank: int, P: int) -> torch.Tensor:
    """(rows, width) inputs: a table gradient (dense or COO), and one whose rows cancel across ranks."""
    if case == "cancelling_rows":
        t = CASES["matrix"](rank, P, torch.float32)
        if rank == 1:
            t = -CASES["matrix"](0, P, torch.float32)
            t[::2] = 0
        return t
    if case in ("empty_ranks", "all_empty"):
        return CASES[case](rank, P, torch.float32).view(-1, 1)
    return CASES[case](rank, P, torch.float32)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("P", [1, 3, 4])
def test_rows_and_sparse_results(scheme: str, P: int) -> None:
    """A table gradient synced as rows (`rows=True`: one index per row) or returned as a COO tensor over the
    union's rows (`sparse_result`): the same sum as the flat dense sync, identical on every rank; a COO
    result is coalesced and only holds rows some rank has; the mean divides it."""
    for case in ROW_CASES:
        tensors = [_row_case(case, r, P) for r in range(P)]
        total, magnitude = reference_sum(tensors)
        dense_in = [t.to_dense() for t in tensors]
        as_rows = zen.simulate(scheme, dense_in, seed=P, rows=True)
        coo = zen.simulate(scheme, tensors, seed=P, rows=True, sparse_result=True)
        mean = zen.simulate(scheme, tensors, seed=P, rows=True, sparse_result=True, divisor=P)
        touched = torch.stack([t.to_dense().reshape(t.shape[0], -1) != 0 for t in tensors]).any(0).any(1)
        for r in range(P):
            assert matches_reference(as_rows.outputs[r], total, magnitude, P), (scheme, case, r)
            out = coo.outputs[r]
            assert out.layout == torch.sparse_coo and out.is_coalesced() and out.shape == tensors[0].shape
            assert matches_reference(out.to_dense(), total, magnitude, P), (scheme, case, r)
            assert bool(touched[out.indices()[0]].all()), (scheme, case)
            assert torch.equal(out.to_dense(), coo.outputs[0].to_dense())
            assert torch.equal(mean.outputs[r].to_dense(), out.to_dense() / P)
        work = [t.clone() for t in dense_in]
        in_place = zen.simulate(scheme, work, seed=P, rows=True, outs=work)
        assert in_place.phases == as_rows.phases
        assert all(torch.equal(a, b) for a, b in zip(in_place.outputs, as_rows.outputs, strict=True))


@pytest.mark.parametrize("scheme", ["zen", "zen-bp", "zen-hc", "agsparse"])
@pytest.mark.parametrize("P", [1, 3, 4])
def test_sparse_result_never_builds_the_dense_table(scheme: str, P: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Zen's schemes (and AGsparse) hand a COO input back as COO without ever allocating the M x D table."""
    from zen.output import RowsOutput

    def no_table(self: RowsOutput) -> torch.Tensor:
        raise AssertionError("a dense table was built for a sparse result")

    monkeypatch.setattr(RowsOutput, "buffer", property(no_table))
    tensors = [CASES["coo"](r, P, torch.float32) for r in range(P)]
    total, magnitude = reference_sum(tensors)
    for choice in ((None, "bp", "hc") if scheme == "zen" else (None,)):
        options = {"choice": choice} if choice else {}
        res = zen.simulate(scheme, tensors, seed=P, sparse_result=True, warmup=1, **options)
        assert all(matches_reference(o.to_dense(), total, magnitude, P) for o in res.outputs)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("kernels", ["native", "torch-op"])
def test_in_place_table_writes_only_its_rows(scheme: str, kernels: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wide table gradient with few rows, synced in place as rows (DDP's bucket view of an embedding): only
    the touched rows are written (no streamed pass over the table), with the same bits as out of place,
    mean included, and the untouched rows stay zero."""
    from zen import output

    real, streamed = output.native.fill_sum, []
    with native.disabled() if kernels == "torch-op" else contextlib.nullcontext():
        for P in (1, 3, 4):
            tensors = []
            for r in range(P):
                g = torch.Generator().manual_seed(r)
                t = torch.zeros(20_000, 64)
                rows = torch.randint(0, 200, (10,), generator=g)  # skewed: rows overlap across ranks
                t[rows] = torch.randn(10, 64, generator=g)
                tensors.append(t)
            apart = zen.simulate(scheme, tensors, seed=P, rows=True, divisor=P)
            work = [t.clone() for t in tensors]
            monkeypatch.setattr(output.native, "fill_sum", lambda *a: streamed.append(1) or real(*a))
            inplace = zen.simulate(scheme, work, seed=P, rows=True, outs=work, divisor=P)
            monkeypatch.setattr(output.native, "fill_sum", real)
            for a, b in zip(apart.outputs, inplace.outputs, strict=True):
                assert torch.equal(a.view(torch.int32), b.view(torch.int32)), (scheme, P)
    assert not streamed


def test_server_paths_script_compares_equal_messages(capsys: pytest.CaptureFixture[str]) -> None:
    """scripts/bp_server_paths.py times both server paths on messages it checks are equal; bad widths exit 2."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import bp_server_paths

    with pytest.raises(SystemExit) as refused:
        bp_server_paths.main(["--widths", "1,x"])
    assert refused.value.code == 2
    assert bp_server_paths.main(["--numel", "2^14", "--widths", "1,4", "--repeats", "1"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [r[0] for r in rows] == ["1"] * 5 + ["4"] * 5
