"""Compressors (zen.compress) through every scheme: the synchronized result is exactly the sum of what the
ranks' compressors chose, identical on every rank; what they left out is kept (error feedback), bytes match
the prediction, and the DDP hook with a compressor gives every rank the mean of the ranks' choices."""

from __future__ import annotations

import contextlib

import pytest
import torch

import zen
from harness.launch import spawn
from zen import native
from zen.compress import compressors, make_compressor, sparsifiers
from zen.compress.base import PartContext
from zen.compress.qsgd import QSGD
from zen.compress.sign import pack_signs, unpack_signs
from zen.compress.topk import exact_topk, sampled_choose, trim_largest

from .helpers import check_compressed_sum, check_error_feedback, compare, compressor_inputs

SPARSIFIERS = sparsifiers()
QUANTIZERS = sorted(set(compressors()) - set(SPARSIFIERS))


@pytest.mark.parametrize("compress", compressors())
@pytest.mark.parametrize("scheme", zen.schemes())
@pytest.mark.parametrize("P", [1, 3, 4])
@pytest.mark.parametrize("kind", ["random", "zeros_on_one", "ties", "sparse"])
def test_result_is_the_sum_of_what_the_compressors_chose(compress: str, scheme: str, P: int, kind: str) -> None:
    check_compressed_sum(compress, scheme, P, kind)


@pytest.mark.parametrize("compress", compressors())
def test_error_feedback_keeps_what_was_not_sent(compress: str) -> None:
    check_error_feedback(compress)


@pytest.mark.parametrize("compress", SPARSIFIERS)
@pytest.mark.parametrize("scheme", zen.schemes())
def test_bytes_of_compressed_gradients_match_the_prediction(compress: str, scheme: str) -> None:
    """`predict` takes the index sets the compressor chose, like any other sets."""
    P = 4
    tensors = compressor_inputs("random", P)
    for t in tensors:
        make_compressor(compress, 0.05).compress(t, PartContext("p", 3, 0, P))
    compare(scheme, tensors)


def test_sign_codes_round_trip() -> None:
    x = torch.randn(1001)
    assert torch.equal(unpack_signs(pack_signs(x), 1001, torch.float32), torch.where(x >= 0, 1.0, -1.0))


def test_qsgd_is_unbiased_and_keeps_its_levels() -> None:
    """QSGD's stochastic rounding: the mean of many codes of one vector is the vector; every element is
    sign x level x its bucket's norm / s with a level in 0..s."""
    x = torch.randn(200, generator=torch.Generator().manual_seed(3))
    total = torch.zeros(200, dtype=torch.float64)
    comp = QSGD(levels=16, bucket=64)
    scales = torch.stack([x[i : i + 64].norm() for i in range(0, 200, 64)]).repeat_interleave(64)[:200] / 16
    for i in range(2000):
        sent = x.clone()
        comp.compress(sent, PartContext(("p", i), 0, 0, 2))  # a fresh residual each time: the code alone
        levels = sent.abs() / scales
        assert torch.allclose(levels, levels.round(), atol=1e-3) and float(levels.max()) <= 16 + 1e-3
        total += sent.double()
    assert torch.allclose(total / 2000, x.double(), atol=0.05)


@pytest.mark.parametrize("compress", QUANTIZERS)
def test_quantizer_bytes_match_its_prediction(compress: str) -> None:
    for P in (1, 3, 4):
        res = zen.simulate("allreduce", compressor_inputs("random", P), compress=compress)
        want = make_compressor(compress).predict(P, 3001)
        for r in range(P):
            assert {p: v[r] for p, v in res.phases.items() if v[r] and p != "meta"} == \
                {p: v for p, v in want.items() if p != "meta"}
            assert res.phases.get("meta", [0] * P)[r] >= want.get("meta", 0)


def test_topk_keeps_the_largest_and_the_sampled_threshold_stays_close() -> None:
    x = torch.randn(100_000, generator=torch.Generator().manual_seed(1))
    k = 5_000
    ids = exact_topk(x, k)
    assert ids.numel() == k and bool((ids[1:] > ids[:-1]).all())
    assert float(x.abs()[ids].min()) >= float(x.abs().kthvalue(x.numel() - k + 1).values) - 1e-6
    flat, res = x.clone(), torch.zeros_like(x)
    approx, values = sampled_choose(flat, res, flat, k, 0.01, torch.Generator().manual_seed(2))
    assert k // 2 <= approx.numel() <= k and bool((approx[1:] > approx[:-1]).all())
    assert len(set(approx.tolist()) & set(ids.tolist())) >= 0.9 * approx.numel()
    assert torch.equal(values, x[approx]) and torch.equal(flat + res, x), "sent + kept = the gradient"


def _sweepcompressor_inputs(kind: str, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(n)
    res, grad = torch.randn(n, generator=gen, dtype=dtype), torch.randn(n, generator=gen, dtype=dtype)
    if kind == "ties":  # equal magnitudes: the threshold is met by far more than k
        res, grad = torch.zeros(n, dtype=dtype), torch.where(grad < 0, -1.0, 1.0).to(dtype)
    elif kind == "mostly_zero":  # fewer non-zeros than k: a zero threshold, every non-zero passes
        grad[torch.rand(n, generator=gen) < 0.99] = 0
        res.zero_()
    elif kind == "spikes":  # a few large values among equal small ones
        res.zero_()
        grad = torch.full((n,), 1e-3, dtype=dtype)
        grad[torch.randperm(n, generator=gen)[: n // 50]] = 5.0
    return res, grad


def _sample_the_tail(monkeypatch: pytest.MonkeyPatch, acc: torch.Tensor) -> None:
    """A sample that drew only the largest elements: its threshold is far too high, fewer than k / 2 pass,
    and the exact top-k must take over."""
    top = acc.abs().topk(64).indices
    monkeypatch.setattr(torch, "randint", lambda high, size, **_: top.repeat(size[0] // 64 + 1)[: size[0]])


@pytest.mark.parametrize("kind", ["random", "ties", "mostly_zero", "spikes", "tail_sampled"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("momentum", [False, True])
@pytest.mark.parametrize("n", [5_000, 300_001])
def test_native_sweep_chooses_what_the_torch_path_chooses(kind: str, dtype: torch.dtype, momentum: bool,
                                                          n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-pass native sweep sends the same elements and keeps the same residual, bit for bit."""
    if native.get("cpu") is None:
        pytest.skip("native kernels unavailable")
    outcomes = []
    for use_native in (True, False):
        res, grad = _sweepcompressor_inputs("random" if kind == "tail_sampled" else kind, n, dtype)
        flat = grad.clone()
        src = (grad * 0.5).clone() if momentum else flat  # a velocity apart from the part, or the part itself
        if kind == "tail_sampled":
            _sample_the_tail(monkeypatch, res + src)
        k = max(1, n // 20)
        if use_native:
            ids, values = sampled_choose(src, res, flat, k, 0.01, torch.Generator().manual_seed(7))
        else:
            with native.disabled():
                ids, values = sampled_choose(src, res, flat, k, 0.01, torch.Generator().manual_seed(7))
        assert ids.numel() <= k and bool((ids[1:] > ids[:-1]).all())
        if kind == "tail_sampled":
            assert ids.numel() == k, "the exact top-k took over"
        outcomes.append((ids, values, res, flat))
    for a, b in zip(*outcomes, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("kind", ["random", "ties", "few_ties"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_trim_keeps_the_k_largest_ties_to_the_lower_ids(kind: str, dtype: torch.dtype) -> None:
    """A sweep's surplus goes back to the residual: the k largest magnitudes stay sent, and of the values
    equal to the k-th largest the ones with the lower ids; native and torch paths alike, bit for bit."""
    gen = torch.Generator().manual_seed(3)
    n, m, k = 50_000, 4_000, 3_000
    ids = torch.randperm(n, generator=gen)[:m].sort().values
    values = torch.randn(m, generator=gen, dtype=dtype)
    if kind == "ties":
        values = torch.where(values < 0, -2.0, 2.0).to(dtype)
    elif kind == "few_ties":  # the k-th largest magnitude shared by a handful around it
        order = values.abs().topk(k + 3).indices
        values[order[k - 4:]] = -values[order[k - 1]].abs()
    outcomes = []
    for use_native in (True, False) if native.get("cpu") is not None else (False,):
        res, flat = torch.zeros(n, dtype=dtype), torch.zeros(n, dtype=dtype)
        flat[ids] = values
        with contextlib.nullcontext() if use_native else native.disabled():
            kept, sent = trim_largest(res, flat, ids, values, k)
        mag = values.abs()
        tau = mag.sort(descending=True).values[k - 1]
        want = (mag > tau) | ((mag == tau) & ((mag == tau).cumsum(0) <= k - int((mag > tau).sum())))
        assert torch.equal(kept, ids[want]) and torch.equal(sent, values[want])
        assert kind != "few_ties" or int((mag[want] == tau).sum()) == 4, "4 of the 7 tied at the k-th"
        assert torch.equal(flat[ids] + res[ids], values) and int((flat != 0).sum()) == k
        outcomes.append((kept, sent, res, flat))
    for a, b in zip(*outcomes, strict=True) if len(outcomes) == 2 else ():
        assert torch.equal(a, b)


def test_dgc_warms_up_masks_momentum_and_clips() -> None:
    dgc = make_compressor("dgc", 0.01, warmup_steps=4, warmup_density=0.25, clip_norm=1.0)
    densities = [dgc.density_at(s) for s in range(6)]
    assert densities[0] == pytest.approx(0.25) and densities[4:] == [0.01, 0.01]
    assert all(a > b for a, b in zip(densities[:4], densities[1:5], strict=True))
    grad = torch.randn(10_000) * 100
    sent = grad.clone()
    dgc.compress(sent, PartContext("p", 0, 10, 4))
    chosen = sent != 0
    assert float(dgc.momenta["p"][chosen].abs().max()) == 0.0, "momentum factor masking"
    assert float((sent + dgc.memory["p"]).norm()) == pytest.approx(1.0 / 2, rel=1e-4), "clipped to 1/sqrt(4)"


def test_randomk_chooses_the_same_elements_on_every_rank() -> None:
    chosen = []
    for r in range(3):
        t = torch.randn(5000, generator=torch.Generator().manual_seed(r))
        make_compressor("randomk", 0.05).compress(t, PartContext(("rank", r), 7, 2, 3))
        chosen.append((t != 0).nonzero().view(-1))
    assert all(torch.equal(c, chosen[0]) for c in chosen)


def test_bad_compressor_settings_are_refused() -> None:
    with pytest.raises(zen.ZenInputError, match="unknown compressor"):
        zen.ZenHookState(compress="nope")
    with pytest.raises(zen.ZenInputError, match="density"):
        zen.ZenHookState(compress="topk", density=0.0)
    with pytest.raises(zen.ZenInputError, match="bad options"):
        zen.ZenHookState(compress="topk", compress_options={"bogus": 1})


@pytest.mark.slow
@pytest.mark.parametrize("P", [1, 3])
def test_hook_returns_the_mean_of_what_every_rank_chose(P: int) -> None:
    """Real gloo ranks, DDP, three steps (residuals carried): each rank's gradient after backward equals the
    float64 mean of the tensors the ranks' compressors sent."""
    cases = [{"scheme": s, "compress": c} for c in compressors() for s in zen.schemes()]
    per_rank = spawn("tests.compress_cases:every_case", P, {"cases": cases}, timeout_s=600)
    for k, case in enumerate(cases):
        ranks = [results[k] for results in per_rank]
        for rank in ranks:
            assert torch.allclose(rank["grads"].double(), rank["expected"], rtol=1e-6, atol=1e-7), case
            assert torch.equal(rank["grads"], ranks[0]["grads"]), case
            assert all(len(r) == 1 and r[0] > 0 for r in rank["residuals"]), "residual norms in the records"


@pytest.mark.parametrize("compress", SPARSIFIERS)
def test_bench_and_model_take_compressedcompressor_inputs(compress: str, capsys) -> None:
    """zen bench --compress: every scheme correct on what the compressor chose, sparse ones moving fewer
    bytes than allreduce; zen model --compress predicts from the same sets."""
    from harness.bench.harness import BenchConfig, run_bench
    from zen.cli import main

    rows = run_bench(BenchConfig(world_size=3, schemes=zen.schemes(), numel=20_000, density=0.05, repeats=1,
                                 warmup=0, compress=compress))
    by = {r["scheme"]: r for r in rows}
    assert all(r["correct"] for r in rows) and by["zen"]["pattern"] == f"{compress}-chosen"
    assert by["zen"]["bytes_received_max"] < by["allreduce"]["bytes_received_max"] / 3
    assert main(["model", "-n", "3", "--numel", "20000", "--density", "0.05", "--compress", compress]) == 0
    assert "zen" in capsys.readouterr().out
