#!/usr/bin/env python
"""One-shot check of Zen on one CUDA GPU: one command, one table, each check beside a negative control.

Builds the CUDA kernels (a failed build, or one whose architectures miss this GPU, is one failing row; the
kernel rows then say they did not run), compares every kernel with the torch-op reference computed on the CPU
(ZEN_NATIVE=0) on random and adversarial inputs (index 0, last index, empty, full density, duplicates,
-0.0 / NaN, full serial regions), runs whole zen-bp and zen-hc syncs (also in place) on CUDA tensors against
CPU ones and every compressor on CUDA tensors. Then the DDP hook on CUDA tensors, 2 gloo ranks sharing the GPU,
each check with a deliberately broken variant that it must reject (harness.gpucheck.table):
- the hook against DDP's own allreduce (loss curve and parameters, dense and COO embeddings);
- host syncs (torch.cuda.set_sync_debug_mode) inside the hook's calls on backward's thread, which on a GPU
  is autograd's device thread; control: the same hook after one injected host read;
- the race: bucket results poisoned and written late on the lane's stream, and what DDP hands the optimizer,
  read on the default stream at once, against the mean of the ranks' gradients; control: a Future without
  the stream dependency;
- the overlap: a profiler trace of one backward, the lanes' device work on streams of their own while
  backward's stream is busy; control: the hook lane-free (inline, on backward's stream).
Kernel timings are `zen kernels-bench --device cuda`; multi-rank NCCL is scripts/nccl_check.py (>= 2 GPUs).
Exit status: 0 every row passed, 1 a row failed, 2 no CUDA (or bad arguments).

    python scripts/gpu_check.py [--json FILE] [--traces DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the harness runs from a checkout

import zen  # noqa: E402
from harness.gpucheck.syncs import judge_syncs  # noqa: E402
from harness.gpucheck.table import PASS, Once, Row, exit_status, render, require, run_row, skipped  # noqa: E402
from harness.gpucheck.trace import judge_overlap  # noqa: E402
from harness.gpucheck.verdicts import judge_hook, judge_race  # noqa: E402
from zen import hashing, native  # noqa: E402
from zen.encodings import get_encoding  # noqa: E402
from zen.grad import LocalGrad  # noqa: E402
from zen.native.build import cuda_arch_list, load_extension  # noqa: E402

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
            require(torch.equal(native.hash_values(index.to(dev), family).cpu(), want), "hash32 differs")
            for n in (1, 7, 128, 2000):  # 2000: the global-atomics histogram path
                for r1_factor, r2_ratio in ((2.0, 0.1), (0.02, 0.01)):
                    fast = hashing.hierarchical_hash(index.to(dev), n, family, r1_factor, r2_ratio)
                    with native.disabled():
                        ref = hashing.hierarchical_hash(index, n, family, r1_factor, r2_ratio)
                    require(fast.counts == ref.counts, f"counts differ (n={n}, {dtype})")
                    require(torch.equal(fast.order.cpu().sort().values, torch.arange(index.numel())), "lost rows")
                    require(torch.equal(membership(fast.order, fast.counts, index),
                                        membership(ref.order, ref.counts, index)), f"membership differs (n={n})")


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
                    require(torch.equal(got[0].cpu(), want[0]), f"row ids differ ({dtype}, M={M}, D={D})")
                    require(same_bits(got[1], want[1]), f"values differ ({dtype}, M={M}, D={D})")


def check_server_rows(dev: torch.device, g: torch.Generator) -> None:
    family = hashing.HashFamily.from_seed(5)
    for num_rows in (0, 1, 1000, (1 << 20) + 7, 3_000_001):
        for n in (1, 3, 16, 128, 1024):
            fast = native.server_rows(num_rows, n, family, dev)
            with native.disabled():
                ref = hashing.build_server_rows(num_rows, n, family.seed, "cpu")
            require(fast is not None and fast[1] == ref[1], f"offsets differ (M={num_rows}, n={n})")
            require(same_bits(fast[0], ref[0]), f"S_j differ (M={num_rows}, n={n})")


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
                    require(count == ref_count and same_bits(payload, ref_payload), f"bitmap differs ({dtype}, M={M})")
                    require(same_bits(values, ref_values), f"encoded values differ ({dtype}, M={M})")
                    ids = HASH_BITMAP.decode(payload, mine.to(dev), M)
                    require(same_bits(ids, ref_ids), f"decode differs ({dtype}, M={M})")
                    got = torch.full((M, D), 7, dtype=dtype, device=dev)
                    require(native.scatter_hash_bitmap(got, payload, mine.to(dev), values), "scatter did not run")
                    want = torch.full((M, D), 7, dtype=dtype).index_copy_(0, ref_ids.long(), ref_values)
                    require(same_bits(got, want), f"scatter differs ({dtype}, M={M})")


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
                require(same_bits(a, c), f"{scheme} output differs ({dtype})")
                require(same_bits(b, c), f"{scheme} in-place output differs ({dtype})")
            require(fast.bytes_received == ref.bytes_received == in_place.bytes_received, f"{scheme} bytes differ")


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
            require(a.is_cuda and torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-6), name)
    return ", ".join(compressors())


Check = Callable[[torch.device, torch.Generator], "str | None"]
KERNEL_CHECKS: list[tuple[str, Check]] = [  # compare the CUDA kernels with the CPU's torch ops
    ("hash values + hierarchical hashing", check_hash),
    ("non-zero extraction", check_extract),
    ("S_j (server_rows)", check_server_rows),
    ("hash bitmap encode / decode / scatter", check_bitmap),
]
DEVICE_CHECKS: list[tuple[str, Check]] = [  # CUDA tensors against CPU ones, with or without the kernels
    ("zen-bp and zen-hc syncs (and in place), CUDA vs CPU reference", check_simulate),
    ("every compressor on CUDA tensors", check_compressors),
]


def build_row() -> Row:
    """The CUDA kernels built (or loaded) for this GPU: a failure is this row, never an abort."""

    def build() -> str:
        start = time.perf_counter()
        load_extension("cuda")
        major, minor = torch.cuda.get_device_capability()
        return (f"{time.perf_counter() - start:.0f} s, TORCH_CUDA_ARCH_LIST={cuda_arch_list()}, "
                f"{torch.cuda.get_device_name()} (compute {major}.{minor})")

    return run_row("CUDA kernels build and cover this GPU", build)


def device_rows(dev: torch.device, built: bool) -> list[Row]:
    rows = []
    for k, (name, fn) in enumerate(KERNEL_CHECKS + DEVICE_CHECKS):
        if not built and (name, fn) in KERNEL_CHECKS:
            rows.append(skipped(name, "not run: no CUDA kernels (see the build row)"))
            continue
        rows.append(run_row(name, lambda fn=fn, k=k: fn(dev, torch.Generator().manual_seed(k)) or ""))
        hashing.TABLES.clear()
        _progress(rows[-1])
    return rows


def _ranks(target: str, kwargs: dict, ranks: int = 2) -> list:
    """`target` of scripts/gpu_cases.py on `ranks` gloo ranks sharing this GPU."""
    from harness.launch import spawn

    scripts = str(Path(__file__).resolve().parent)
    return spawn(f"gpu_cases:{target}", ranks, kwargs, timeout_s=180,  # a hang fails its rows within the 8 minutes
                 env=lambda r: {"PYTHONPATH": f"{scripts}:{ROOT}"})


def hook_rows(traces: Path | None) -> list[Row]:
    """The DDP hook on CUDA tensors, 2 gloo ranks on one GPU: each check beside its negative control."""
    hook = Once(lambda: _ranks("hook_vs_ddp", {}))
    syncs = Once(lambda: _ranks("syncs_per_step", {"cases": [(False, False), (True, False), (False, True)]})[0])
    race = Once(lambda: _ranks("race", {})[0])
    overlap = Once(lambda: _ranks("overlap", {"trace_dir": str(traces) if traces else None})[0])
    rows = []
    for name, check, control in [
        ("DDP hook vs DDP's allreduce (dense and COO embeddings)", lambda: judge_hook(hook()), None),
        ("no host sync in hook calls on backward's thread (dense; COO)",
         lambda: "; ".join(judge_syncs(c) for c in syncs()[:2]), lambda: judge_syncs(syncs()[2])),
        ("DDP reads bucket results only after the lane's stream wrote them",
         lambda: judge_race(race()["check"]), lambda: judge_race(race()["control"])),
        ("the lanes' device work overlaps backward's (profiler trace)",
         lambda: judge_overlap(overlap()["check"]), lambda: judge_overlap(overlap()["control"])),
    ]:
        rows.append(run_row(name, check, control))
        _progress(rows[-1])
    return rows


def _progress(row: Row) -> None:
    print(f"{row.status}  {row.name} ({row.seconds:.0f} s)", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None, help="also write the rows to this JSON file")
    parser.add_argument("--traces", type=Path, default=None, help="keep the overlap check's profiler traces here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(f"gpu_check: CUDA is not available (torch {torch.__version__} sees no GPU); nothing to check. Run it "
              "on a CUDA machine; CI covers the kernels with `python -m zen.native.compile_check`.", file=sys.stderr)
        return 2
    start = time.perf_counter()
    if args.traces:
        args.traces.mkdir(parents=True, exist_ok=True)
    rows = [build_row()]
    _progress(rows[0])
    rows += device_rows(torch.device("cuda"), built=rows[0].status == PASS)
    torch.cuda.empty_cache()
    rows += hook_rows(args.traces)
    print(f"\n# gpu_check: {torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"{time.perf_counter() - start:.0f} s")
    print(render(rows))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return exit_status(rows)


if __name__ == "__main__":
    sys.exit(main())
