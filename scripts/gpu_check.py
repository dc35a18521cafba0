#!/usr/bin/env python
"""One-shot check of Zen on one CUDA GPU (a few minutes).

Builds the CUDA extension, compares every kernel with the torch-op reference computed on the CPU
(ZEN_NATIVE=0) on fresh random and adversarial inputs (index 0, last index, empty, full density,
duplicates, -0.0 / NaN, full serial regions), runs whole zen-bp and zen-hc syncs (also in place) on
CUDA tensors against CPU ones, every compressor on CUDA tensors, and the DDP hook on CUDA tensors (2 gloo
ranks sharing the GPU: loss and parameters against DDP's own allreduce, host synchronizations per step by
thread under torch.cuda.set_sync_debug_mode, and a torch.profiler timeline of how much of the hook's lane
stream runs while backward does), then times the kernels at the paper's DeepFM size (214M elements, 5.2%
density) and prints a table last. One GPU cannot run multi-rank NCCL: scripts/nccl_check.py does, on >= 2.
Exit status: 0 all checks passed, 1 a check failed, 2 no CUDA.

    python scripts/gpu_check.py [--numel N] [--density D] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

import zen
from zen import hashing, native
from zen.encodings import get_encoding
from zen.grad import LocalGrad
from zen.native import bench
from zen.native.build import load_extension

CPU = torch.device("cpu")
HASH_BITMAP = get_encoding("hash_bitmap")


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.cpu(), b.cpu()
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.contiguous().view(torch.uint8),
                                                                     b.contiguous().view(torch.uint8))


def membership(order: torch.Tensor, counts: list[int], index: torch.Tensor) -> torch.Tensor:
    """Sorted (partition << 32 | row id) keys: equal iff the partitions hold the same rows."""
    part = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts, dtype=torch.int64))
    return torch.sort(part * 2**32 + index.cpu().long()[order.cpu()]).values


def index_cases(dtype: torch.dtype, g: torch.Generator) -> list[torch.Tensor]:
    top = 2**31 - 1 if dtype == torch.int32 else 2**32 - 1
    big = torch.randint(0, top, (200_000,), generator=g, dtype=torch.int64).unique()
    return [torch.empty(0, dtype=dtype), torch.tensor([0], dtype=dtype), torch.tensor([top], dtype=dtype),
            torch.tensor([5, 5, 5, 0, 0, top], dtype=dtype), torch.arange(100_000, dtype=dtype),
            big[torch.randperm(big.numel(), generator=g)].to(dtype)]


def check_hash(dev: torch.device, g: torch.Generator) -> None:
    family = hashing.HashFamily.from_seed(99, 5)
    for dtype in (torch.int32, torch.int64):
        for index in index_cases(dtype, g):
            want = torch.stack([family.hash32(index, lv) for lv in range(family.k + 1)]).view(family.k + 1, -1)
            assert torch.equal(native.hash_values(index.to(dev), family).cpu(), want), "hash32 differs"
            for n in (1, 7, 128, 2000):  # 2000: the global-atomics histogram path
                for r1_factor, r2_ratio in ((2.0, 0.1), (0.02, 0.01)):
                    fast = hashing.hierarchical_hash(index.to(dev), n, family, r1_factor, r2_ratio)
                    with native.disabled():
                        ref = hashing.hierarchical_hash(index, n, family, r1_factor, r2_ratio)
                    assert fast.counts == ref.counts, f"counts differ (n={n}, {dtype})"
                    assert torch.equal(fast.order.cpu().sort().values, torch.arange(index.numel())), "lost rows"
                    assert torch.equal(membership(fast.order, fast.counts, index),
                                       membership(ref.order, ref.counts, index)), f"membership differs (n={n})"


def dense_cases(M: int, D: int, dtype: torch.dtype, g: torch.Generator) -> list[torch.Tensor]:
    sparse = torch.zeros(M, D, dtype=dtype)
    mask = torch.rand(M, generator=g) < 0.052
    sparse[mask, D - 1] = torch.randn(int(mask.sum()), generator=g).to(dtype)
    if M:
        sparse[0, 0], sparse[-1, -1], sparse[M // 2, 0], sparse[M // 3, 0] = 1, -2, -0.0, float("nan")
    return [torch.zeros(M, D, dtype=dtype), torch.ones(M, D, dtype=dtype), sparse]


def check_extract(dev: torch.device, g: torch.Generator) -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        for M, D in ((0, 1), (1, 1), (31, 1), (1_000_003, 1), (50_000_001, 1), (4097, 3)):
            for dense in dense_cases(M, D, dtype, g):
                views = [(dense, dense.to(dev))]
                if D == 1 and M > 1:  # a view one element in: not 16-byte aligned, so the row-wise kernel
                    views.append((dense[1:], dense.to(dev)[1:]))
                for host, on_dev in views:
                    got = LocalGrad(host.shape[0], D, dtype, dev, dense=on_dev).rows()
                    with native.disabled():
                        want = LocalGrad(host.shape[0], D, dtype, CPU, dense=host).rows()
                    assert torch.equal(got[0].cpu(), want[0]), f"row ids differ ({dtype}, M={M}, D={D})"
                    assert same_bits(got[1], want[1]), f"values differ ({dtype}, M={M}, D={D})"


def check_server_rows(dev: torch.device, g: torch.Generator) -> None:
    family = hashing.HashFamily.from_seed(5)
    for num_rows in (0, 1, 1000, (1 << 20) + 7, 3_000_001):
        for n in (1, 3, 16, 128, 1024):
            fast = native.server_rows(num_rows, n, family, dev)
            with native.disabled():
                ref = hashing.build_server_rows(num_rows, n, family.seed, "cpu")
            assert fast is not None and fast[1] == ref[1], f"offsets differ (M={num_rows}, n={n})"
            assert same_bits(fast[0], ref[0]), f"S_j differ (M={num_rows}, n={n})"


def check_bitmap(dev: torch.device, g: torch.Generator) -> None:
    family = hashing.HashFamily.from_seed(5)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for M, D, density in ((1, 1, 1.0), (13, 1, 0.5), (2_000_003, 1, 0.3), (30_001, 4, 0.2), (4096, 1, 0.0)):
            out = torch.zeros(M, D, dtype=dtype)
            mask = torch.rand(M, generator=g) < density
            out[mask] = torch.randn(int(mask.sum()), D, generator=g).to(dtype)
            with native.disabled():
                members, offsets = hashing.build_server_rows(M, 3, family.seed, "cpu")
            for j in range(3):
                for idx_dtype in (torch.int32, torch.int64):
                    mine = members[offsets[j] : offsets[j + 1]].to(idx_dtype)
                    (payload, values), count = HASH_BITMAP.encode(out.to(dev), mine.to(dev), torch.int32)
                    with native.disabled():
                        (ref_payload, ref_values), ref_count = HASH_BITMAP.encode(out, mine, torch.int32)
                        ref_ids = HASH_BITMAP.decode(ref_payload, mine, M)
                    assert count == ref_count and same_bits(payload, ref_payload), f"bitmap differs ({dtype}, M={M})"
                    assert same_bits(values, ref_values), f"encoded values differ ({dtype}, M={M})"
                    ids = HASH_BITMAP.decode(payload, mine.to(dev), M)
                    assert same_bits(ids, ref_ids), f"decode differs ({dtype}, M={M})"
                    got = torch.full((M, D), 7, dtype=dtype, device=dev)
                    assert native.scatter_hash_bitmap(got, payload, mine.to(dev), values)
                    want = torch.full((M, D), 7, dtype=dtype).index_copy_(0, ref_ids.long(), ref_values)
                    assert same_bits(got, want), f"scatter differs ({dtype}, M={M})"


def check_simulate(dev: torch.device, g: torch.Generator) -> None:
    M, P = 1_000_000, 4
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        tensors = []
        for r in range(P):
            t = torch.zeros(M, dtype=dtype)
            idx = torch.randint(0, M, (M // 20,), generator=g)
            t[idx] = torch.randn(idx.numel(), generator=g).to(dtype)
            t[0], t[-1] = r + 1, -(r + 1)
            tensors.append(t)
        for scheme in ("zen-bp", "zen-hc"):
            hashing.TABLES.clear()
            fast = zen.simulate(scheme, [t.to(dev) for t in tensors], seed=3)
            work = [t.to(dev, copy=True) for t in tensors]
            in_place = zen.simulate(scheme, work, seed=3, outs=work)  # out = the input, as in DDP buckets
            with native.disabled():
                ref = zen.simulate(scheme, tensors, seed=3)
            for a, b, c in zip(fast.outputs, in_place.outputs, ref.outputs, strict=True):
                assert same_bits(a, c), f"{scheme} output differs ({dtype})"
                assert same_bits(b, c), f"{scheme} in-place output differs ({dtype})"
            assert fast.bytes_received == ref.bytes_received == in_place.bytes_received, f"{scheme} bytes differ"


def _ranks(target: str, kwargs: dict, ranks: int = 2) -> list:
    """`target` of scripts/gpu_cases.py on `ranks` gloo ranks sharing this GPU."""
    from harness.launch import spawn

    scripts = str(Path(__file__).resolve().parent)
    return spawn(f"gpu_cases:{target}", ranks, kwargs, timeout_s=600, env=lambda r: {"PYTHONPATH": scripts})


def check_ddp_hook(dev: torch.device, g: torch.Generator) -> str:
    """The DDP hook on CUDA tensors: 2 gloo ranks sharing the GPU train the Recommender with dense and COO
    embeddings; the hook's loss curve and parameters match DDP's built-in allreduce."""
    worst = 0.0
    for sparse in (False, True):
        ranks = _ranks("hook_vs_ddp", {"sparse": sparse})
        ref, ours = ranks[0]["ddp"], ranks[0]["zen"]
        assert ours["checksum"] == ranks[1]["zen"]["checksum"], "parameters differ across ranks"
        diff = max(abs(a - b) for a, b in zip(ref["losses"], ours["losses"], strict=True))
        assert diff <= 1e-4 * max(1.0, abs(ref["losses"][0])), f"loss curve differs by {diff} (sparse={sparse})"
        gap = abs(ref["checksum"] - ours["checksum"]) / max(1.0, abs(ref["checksum"]))
        assert gap <= 1e-5, f"parameters differ from DDP's by {gap:.2e} (relative, sparse={sparse})"
        worst = max(worst, diff, gap)
    return f"largest loss / parameter difference {worst:.1e}"


def check_syncs(dev: torch.device, g: torch.Generator) -> str:
    """Host synchronizations in one steady-state backward, by thread: none may sit on backward's thread (its
    stream would wait for every kernel queued so far); the lanes' come from gloo's host staging and the
    communicator's one read per exchange round."""
    out = []
    for sparse in (False, True):
        got = _ranks("syncs_per_step", {"sparse": sparse})[0]
        out.append(f"{'COO' if sparse else 'dense'}: autograd {got.get('autograd', 0)}, lanes {got.get('lane', 0)} "
                   f"({got['buckets']} buckets, {got['rounds']} rounds, {got['counted_reads']} counted reads)")
        assert got.get("autograd", 0) == 0, f"host syncs on backward's thread: {got}"
    return "; ".join(out)


def check_overlap(dev: torch.device, g: torch.Generator) -> str:
    got = _ranks("overlap", {})[0]
    assert got["lane_ms"] > 0, "no work on the hook's lane stream"
    return (f"lane stream {got['lane_ms']:.2f} ms, of it {got['lane_during_backward_ms']:.2f} ms while backward's "
            f"{got['backward_ms']:.2f} ms ran")


def check_compressors(dev: torch.device, g: torch.Generator) -> str:
    """Every compressor on CUDA tensors: draws on the device, and a scheme syncs exactly what they chose."""
    from zen.compress import compressors

    P, M = 3, 300_007
    for name in compressors():
        tensors = [torch.randn(M, generator=g).to(dev) for _ in range(P)]
        res = zen.simulate("zen", [t.clone() for t in tensors], compress=name, density=0.02, validate=False)
        sent = [t.clone() for t in tensors]  # what each compressor chose, from a twin with the same state
        twin = zen.simulate("allreduce", sent, compress=name, density=0.02, validate=False)
        for a, b in zip(res.outputs, twin.outputs, strict=True):
            assert a.is_cuda and torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-6), name
    return ", ".join(compressors())


CHECKS: list[tuple[str, Callable[[torch.device, torch.Generator], str | None]]] = [
    ("hash values + hierarchical hashing", check_hash),
    ("non-zero extraction", check_extract),
    ("S_j (server_rows)", check_server_rows),
    ("hash bitmap encode / decode / scatter", check_bitmap),
    ("zen-bp and zen-hc syncs (and in place), CUDA vs CPU reference", check_simulate),
    ("every compressor on CUDA tensors", check_compressors),
    ("DDP hook on CUDA tensors, 2 gloo ranks on one GPU, vs DDP's allreduce", check_ddp_hook),
    ("host synchronizations per step (set_sync_debug_mode)", check_syncs),
    ("profiler: the hook's lane stream overlapping backward", check_overlap),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=int, default=bench.PAPER_NUMEL)
    parser.add_argument("--density", type=float, default=bench.PAPER_DENSITY)
    parser.add_argument("--json", type=Path, default=None, help="write check results and timing rows here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check: CUDA is not available (torch", torch.__version__, "sees no GPU); nothing to check. "
              "Run this on a CUDA machine; CI covers the kernels with `python -m zen.native.compile_check`.")
        return 2
    dev = torch.device("cuda")
    start = time.perf_counter()
    load_extension("cuda")  # raises with the compiler output if the build fails
    print(f"built the CUDA kernels in {time.perf_counter() - start:.0f} s on {torch.cuda.get_device_name(dev)}")
    results = []
    for name, fn in CHECKS:
        t = time.perf_counter()
        try:
            detail = fn(dev, torch.Generator().manual_seed(len(results)))
            results.append((name, "PASS", detail or ""))
        except Exception as exc:
            traceback.print_exc()
            results.append((name, "FAIL", f"{type(exc).__name__}: {exc}"))
        print(f"{results[-1][1]}  {name} ({time.perf_counter() - t:.1f} s)", flush=True)
    torch.cuda.empty_cache()
    timing = argparse.Namespace(device="cuda", numel=args.numel, density=args.density, servers=16,
                                dtype="float32", k=3, r1_factor=2.0, r2_ratio=0.1, repeats=5, no_reference=False,
                                threads=None, seed=0)
    rows = bench.Bench(timing, dev).main_rows()
    print(f"\n# checks ({time.perf_counter() - start:.0f} s total)")
    for name, status, why in results:
        print(f"{status}  {name}{'  ' + why if why else ''}")
    print(f"\n# timings: {args.numel:,} x float32, density {args.density:g}, n=16 (median of 5)")
    bench.print_table(rows)
    if args.json:
        args.json.write_text(json.dumps({"checks": results, "rows": rows}, indent=1))
    return 0 if all(status == "PASS" for _, status, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
