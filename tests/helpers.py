"""Helpers the test modules share, in one module: no test module imports another's functions. The checks that
a parametrised test runs on every registered scheme, encoding and compressor live here, so tests/test_extension.py
runs the same checks on CONTRIBUTING.md's examples; the `netem` fixture is in conftest.py."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

import zen
from harness.bench.patterns import make_gradient
from harness.netem import NetemError, emulated_cluster
from harness.reference import matches_reference, reference_sum
from zen.compress import make_compressor, sparsifiers
from zen.compress.base import PartContext
from zen.prediction import layout_and_sets, predict

from .cases import CASES


def compare(scheme: str, tensors: list[torch.Tensor], tolerance: float = 0.0) -> None:
    """Each rank's measured bytes per phase equal `predict` from the ranks' index sets (within `tolerance`)."""
    seed = 77
    res = zen.simulate(scheme, tensors, seed=seed, warmup=2)  # zen measures on its first two calls
    layout, sets = layout_and_sets(tensors, seed)
    expect = predict(scheme, sets, layout)
    for r, phases in enumerate(expect):
        measured = {p: v[r] for p, v in res.phases.items() if v[r]}
        want = {p: v for p, v in phases.items() if v}
        if tolerance == 0.0:
            assert measured == want, f"{scheme} rank {r}"
        else:
            assert measured.keys() == want.keys(), f"{scheme} rank {r}"
            for p in want:
                assert abs(measured[p] - want[p]) <= tolerance * want[p], f"{scheme} rank {r} {p}"


def check_lossless(scheme: str, case: str, P: int, dtype: torch.dtype, **options: object) -> zen.SimResult:
    """`case` (tests/cases.py) on P simulated ranks: the float64 sum, bit-identical on every rank."""
    tensors = [CASES[case](r, P, dtype) for r in range(P)]
    total, magnitude = reference_sum(tensors)
    res = zen.simulate(scheme, tensors, seed=P, **options)
    for r, out in enumerate(res.outputs):
        assert out.shape == tensors[0].shape and out.dtype == dtype and out.layout == torch.strided
        assert matches_reference(out, total, magnitude, P), f"{scheme} {case} P={P}: rank {r} wrong"
        assert torch.equal(out, res.outputs[0]), f"{scheme} {case} P={P}: rank {r} differs from rank 0"
    return res


def compressor_inputs(kind: str, P: int, n: int = 3001) -> list[torch.Tensor]:
    """P ranks' dense gradients of one of the compressor tests' kinds."""
    gen = torch.Generator().manual_seed(P)
    if kind == "random":
        return [torch.randn(n, generator=gen) for _ in range(P)]
    if kind == "zeros_on_one":  # one rank all zero, others heavy-tailed
        return [torch.zeros(n) if r == 0 else torch.randn(n, generator=gen) ** 3 for r in range(P)]
    if kind == "ties":  # equal magnitudes everywhere: any choice of k is a top-k
        return [torch.where(torch.rand(n, generator=gen) < 0.5, 1.0, -1.0) for _ in range(P)]
    if kind == "sparse":  # already sparser than the density
        return [make_gradient("zipf", n, 0.01, r, P, seed=1) for r in range(P)]
    raise ValueError(kind)


def check_compressed_sum(compress: str, scheme: str, P: int, kind: str) -> None:
    """Through `scheme`, every rank gets the sum of what the ranks' compressors chose (a sparsifier keeps at
    most its density's share)."""
    tensors = compressor_inputs(kind, P)
    res = zen.simulate(scheme, tensors, compress=compress, density=0.05)
    reference = torch.stack([t.double() for t in tensors]).sum(0)  # the tensors now hold what was sent
    for out in res.outputs:
        assert torch.equal(out, res.outputs[0]), "ranks differ"
    assert torch.allclose(res.outputs[0].double(), reference, rtol=1e-6, atol=1e-6)
    if compress in sparsifiers():
        k = math.ceil(0.05 * tensors[0].numel())
        for t in tensors:
            assert int((t != 0).sum()) <= k


def check_error_feedback(compress: str) -> None:
    """sent + residual = gradient (+ the previous residual): nothing is lost, only delayed."""
    comp = make_compressor(compress, 0.1, **({"momentum": 0.0} if compress == "dgc" else {}))
    gen = torch.Generator().manual_seed(0)
    carried = torch.zeros(1000)
    for step in range(3):
        grad = torch.randn(1000, generator=gen)
        sent = grad.clone()
        comp.compress(sent, PartContext("p", 0, step, 2))
        residual = comp.memory["p"]
        exact = not comp.own_exchange  # a sparsifier moves values, a quantizer rounds them
        assert torch.allclose(sent + residual, grad + carried, atol=0 if exact else 1e-5)
        assert comp.residual_norm("p") == pytest.approx(float(residual.norm()))
        carried = residual.clone()


class FakeBucket:
    """What the router reads from a dist.GradBucket, laid out as DDP does (views back to back)."""

    def __init__(self, params: list[torch.Tensor]):
        self._params = params
        self._buffer = torch.arange(sum(p.numel() for p in params), dtype=torch.float32)
        self._grads = list(zip(params, self._buffer.split([p.numel() for p in params]), strict=True))

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def index(self) -> int:
        return 0

    def parameters(self) -> list[torch.Tensor]:
        return self._params

    def gradients(self) -> list[torch.Tensor]:
        return [g.view(p.shape) for p, g in self._grads]


# zen.fsdp's cases (tests/test_fsdp.py, tests/test_fsdp_nccl_rules.py): name -> the embedding's rows, width and how
# many rows a batch may touch; every case also has the dense head
FSDP_SHAPES = {
    "padded": {"rows": 1001, "width": 8, "used": 50},  # 1001 rows: FSDP pads the last shard
    "uneven_rows": {"rows": 250, "width": 3, "used": 250},
    "empty_shard": {"rows": 3, "width": 4, "used": 3},  # 4 ranks: rank 3's shard is padding only
}
# Relative to a parameter's largest magnitude, after the case's steps. Two ranks: a + b == b + a, so bitwise. More
# ranks: gloo's reduce-scatter adds the chunks in its ring's order, Zen in rank order: the sums differ in their last
# bits (fp32: 2**-24 relative per add), which the steps carry on.
FP32_BOUND = 1e-5
BF16_BOUND = 2**-6


def assert_params_equal(a: dict, b: dict, bound: float, what: str) -> None:
    """Every parameter of `b` equals `a`'s: bitwise with `bound` 0, else within `bound` of its largest magnitude."""
    for name, ref in a.items():
        got = b[name]
        if bound == 0:
            assert torch.equal(ref, got), f"{what}: {name} differs by {(ref - got).abs().max().item()}"
        else:
            scale = max(float(ref.abs().max()), 1e-30)
            assert float((ref - got).abs().max()) <= bound * scale, f"{what}: {name} beyond {bound} relative"


def netem_unavailable(userns: bool | None = None) -> str | None:
    """Why no emulated cluster can be made here, or None when one can."""
    try:
        with emulated_cluster(1, "1gbit", userns=userns):
            return None
    except NetemError as e:
        return str(e)


def processes_in(netns_ids: set[str]) -> list[int]:
    """The processes living in any of these network namespaces."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and os.readlink(f"/proc/{entry}/ns/net") in netns_ids:
                found.append(int(entry))
        except OSError:
            pass
    return found


def selected(request: pytest.FixtureRequest, test: str, param: str | None = None) -> list[Any]:
    """This module's tests named `test` that this session runs (after -k, -m, ...): the values of their `param`,
    or the tests themselves (a fixture launches only what a selected test reads)."""
    items = [item for item in request.session.items
             if getattr(item, "originalname", None) == test and getattr(item, "module", None) is request.module]
    return [item.callspec.params[param] for item in items] if param else items


def at_once(jobs: dict[Hashable, Callable[[], Any]], workers: int) -> dict[Hashable, Any]:
    """Run independent jobs (each waiting mostly on processes of its own) `workers` at a time; returns each one's
    result, or the exception it raised. Returns when all have ended: nothing runs on behind a later test."""
    def outcome(job: Callable[[], Any]) -> Any:
        try:
            return job()
        except Exception as exc:  # noqa: BLE001 - handed to the test that reads it
            return exc

    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {key: pool.submit(outcome, job) for key, job in jobs.items()}
    return {key: future.result() for key, future in futures.items()}


def value(got: Any) -> Any:
    """An `at_once` result: the job's value, or the exception it raised, raised here."""
    if isinstance(got, Exception):
        raise got
    return got
