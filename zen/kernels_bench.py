"""`zen kernels-bench`: throughput of the native hashing and encoding kernels vs the torch-op path.

Default case: the paper's DeepFM gradient (214M elements, 5.2% density; section 3 reports ~6 ms of
hierarchical hashing on a V100), scaled down to 2^24 elements on CPU. Every row is the median of
`--repeats` timed runs after one warm-up. The dense scan's bandwidth is set against a same-size
`copy_` on the same device (copy GB/s counts read + write bytes, the STREAM convention; the scan
reads the tensor once). The reference column runs the torch-op path (ZEN_NATIVE=0). Rows: extract =
LocalGrad.rows() (non-zero ids + values); hash+partitions = hierarchical_hash (Algorithm 1 including the
per-partition extraction of positions); S_j = server_rows; the hash bitmap encode and decode + scatter
run on server 0's rows of the same tensor; HC's gap coding (zen.gaps) codes and decodes all its non-zero ids,
its merge sums the even and the odd non-zero rows, and the result write (`DenseOutput.write`, as agsparse and HC's
last round use it) streams every fourth of them as four sets into a dense result.
`--sweep r1` / `--sweep k` reproduce Figure 16: hashing time (and rows reaching the serial region)
against r1 in units of |G|·d_G and against the number of probes k.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from zen import gaps, hashing, native
from zen.algorithms.bp import BITS_SERVERS, compact_sum
from zen.algorithms.partitions import HashPartitions
from zen.encodings import get_encoding
from zen.grad import LocalGrad
from zen.output import DenseOutput
from zen.rows import merge_rows

PAPER_NUMEL = 214_000_000  # DeepFM embedding gradient (section 6)
PAPER_DENSITY = 0.052
CPU_NUMEL = 1 << 24
SWEEPS = {"r1": (0.5, 1.0, 2.0, 4.0, 8.0), "k": (1, 2, 3, 4, 5, 6)}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", help="cpu, cuda[:i] or auto (cuda when available)")
    parser.add_argument("--numel", type=int, default=None,
                        help=f"gradient elements (default {PAPER_NUMEL:,} on CUDA, 2^24 on CPU)")
    parser.add_argument("--density", type=float, default=PAPER_DENSITY, help="fraction of non-zero elements")
    parser.add_argument("--servers", type=int, default=16, help="partitions n (world size)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--k", type=int, default=3, help="probes in the parallel region")
    parser.add_argument("--r1-factor", type=float, default=2.0, help="r1 in units of |G|·d_G (paper: 2)")
    parser.add_argument("--r2-ratio", type=float, default=0.1, help="r2 / r1 (paper: 0.1)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per row (median reported)")
    parser.add_argument("--sweep", choices=("none", *SWEEPS), default="none",
                        help="Figure 16: hashing time vs r1 factor or vs k")
    parser.add_argument("--values", type=float, nargs="+", default=None, help="sweep points (default: a few)")
    parser.add_argument("--no-reference", action="store_true", help="skip the (slow) torch-op timings")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (torch.set_num_threads)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="also write the rows to this JSON file")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], repeats: int, device: torch.device) -> float:
    """Median seconds of `repeats` runs after one warm-up run."""
    fn()
    samples = []
    for _ in range(max(1, repeats)):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def bernoulli_gradient(numel: int, density: float, dtype: torch.dtype, device: torch.device, seed: int) -> torch.Tensor:
    """Dense flat gradient with i.i.d. non-zeros (values never round to zero), drawn on `device`: the paper's
    214M-element case is made on the GPU it is timed on. harness.bench.patterns.make_gradient (a rank's index
    pattern, drawn on the host) is the harness's, which zen does not import."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dense = torch.zeros(numel, dtype=dtype, device=device)
    mask = torch.rand(numel, generator=gen, device=device) < density
    values = torch.rand(int(mask.sum()), generator=gen, device=device) + 0.5
    dense[mask] = values.to(dtype)
    return dense


class Bench:
    """One gradient and its derived inputs; each method returns table rows."""

    def __init__(self, args: argparse.Namespace, device: torch.device):
        self.args, self.device = args, device
        self.numel = args.numel or (PAPER_NUMEL if device.type == "cuda" else CPU_NUMEL)
        self.dtype = DTYPES[args.dtype]
        self.dense = bernoulli_gradient(self.numel, args.density, self.dtype, device, args.seed)
        self.rows2d = self.dense.view(-1, 1)
        self.family = hashing.HashFamily.from_seed(args.seed + 1, args.k)
        self.bytes = self.numel * self.dense.element_size()
        self.index, _ = self._extract()
        self.reference = not args.no_reference and native.get(device) is not None

    def _extract(self) -> tuple[torch.Tensor, torch.Tensor]:
        return LocalGrad(self.numel, 1, self.dtype, self.device, dense=self.rows2d).rows()

    def _hash(self, index: torch.Tensor, r1_factor: float | None = None,
              family: hashing.HashFamily | None = None) -> hashing.Partitions:
        return hashing.hierarchical_hash(index, self.args.servers, family or self.family,
                                         self.args.r1_factor if r1_factor is None else r1_factor, self.args.r2_ratio)

    def row(self, op: str, fn: Callable[[], Any], repeats: int | None = None, scanned: int = 0,
            **extra: Any) -> dict[str, Any]:
        repeats = repeats or self.args.repeats
        t = timed(fn, repeats, self.device)
        ref = None
        if self.reference:
            with native.disabled():
                ref = timed(fn, min(repeats, 3), self.device)
        r = {"op": op, "device": str(self.device), "numel": self.numel, "density": self.args.density,
             "servers": self.args.servers, "dtype": self.args.dtype, "native_ms": t * 1e3,
             "reference_ms": None if ref is None else ref * 1e3,
             "speedup": None if ref is None else ref / t,
             "GBps": scanned / t / 1e9 if scanned else None, **extra}
        return r

    def main_rows(self) -> list[dict[str, Any]]:
        dst = torch.empty_like(self.dense)
        copy_t = timed(lambda: dst.copy_(self.dense), self.args.repeats, self.device)
        copy_gbps = 2 * self.bytes / copy_t / 1e9
        rows = [{"op": "memory copy", "device": str(self.device), "numel": self.numel, "native_ms": copy_t * 1e3,
                 "GBps": copy_gbps}]
        nnz = int(self.index.numel())
        rows.append(self.row("extract (dense scan)", self._extract, scanned=self.bytes, nnz=nnz))
        parts = self._hash(self.index)
        rows.append(self.row("hash+partitions (Alg. 1)", lambda: self._hash(self.index), nnz=nnz,
                             serial_pct=100.0 * parts.serial / max(nnz, 1)))
        rows.append(self.row("extract + hash", lambda: self._hash(self._extract()[0]), nnz=nnz))
        for r in rows[1:]:
            if r.get("GBps"):
                r["pct_of_copy"] = 100.0 * r["GBps"] / copy_gbps
        n, seed = self.args.servers, self.family.seed
        rows.append(self.row("S_j (server_rows)",
                             lambda: hashing.build_server_rows(self.numel, n, seed, str(self.device)),
                             repeats=min(self.args.repeats, 2)))
        members, offsets = hashing.server_rows(self.numel, n, self.family, self.device)
        mine = members[offsets[0] : offsets[1]]
        hash_bitmap = get_encoding("hash_bitmap")
        message, count = hash_bitmap.encode(self.rows2d, mine, torch.int32)
        rows.append(self.row("bitmap encode (Alg. 2)",
                             lambda: hash_bitmap.encode(self.rows2d, mine, torch.int32), rows=count))
        out = torch.zeros_like(self.rows2d)
        rows.append(self.row("bitmap decode + scatter",
                             lambda: hash_bitmap.scatter(out, message[0], mine, message[1], self.numel), rows=count))
        ids = self.index.int()
        codes = gaps.encode(ids)
        rows.append(self.row("HC ids: gap encode", lambda: gaps.encode(ids), rows=nnz))
        rows.append(self.row("HC ids: gap decode", lambda: gaps.decode(codes, nnz, self.numel, torch.int32), rows=nnz))
        column = self.dense[self.index].view(-1, 1)
        halves = [(ids[j::2], column[j::2]) for j in range(2)]
        rows.append(self.row("HC merge: two halves", lambda: merge_rows(*halves), rows=nnz))
        quarters = [(ids[j::4], column[j::4]) for j in range(4)]
        result = DenseOutput(torch.empty_like(self.dense), self.numel, 1)
        rows.append(self.row("result write: four sets", lambda: result.write(quarters), rows=nnz))
        if self.device.type == "cpu" and n <= BITS_SERVERS:
            rows += self.bp_cpu_rows(parts, members, offsets)
        return rows

    def bp_cpu_rows(self, parts: hashing.Partitions, members: torch.Tensor, offsets: tuple[int, ...]
                    ) -> list[dict[str, Any]]:
        """BP's CPU push, server and pull as zen-bp runs them (one native pass each; the reference column: the
        torch-op hierarchical hash and gathers, the sort-based compact sum with encode_rows, and every server's
        decode then the result's write). The push partitions this gradient's rows for n servers. The server
        gets partition 0's rows of this gradient as n ascending pushes of random rows of it; the pull writes all n
        servers' messages of this gradient into a dense result."""
        n, M, enc = self.args.servers, self.numel, get_encoding("hash_bitmap")
        values = self.dense[self.index]
        order = parts.order[: parts.counts[0]]
        shuffled = order[torch.randperm(order.numel(), generator=torch.Generator().manual_seed(self.args.seed))]
        pushed = [(self.index[chunk].int(), values[chunk].view(-1, 1))  # each rank's push ascends (the CPU push)
                  for chunk in (c.sort().values for c in shuffled.tensor_split(n))]
        mine = members[offsets[0] : offsets[1]]
        words = hashing.server_bits(M, n, self.family, self.device)
        positions = hashing.server_ranks(M, n, self.family, self.device, 0)

        def server() -> object:
            return enc.aggregate(pushed, words[0], M) or enc.encode_rows(*compact_sum(pushed, 1), mine, M,
                                                                          positions, torch.int32)

        messages = [enc.encode(self.rows2d, members[offsets[j] : offsets[j + 1]], torch.int32)[0] for j in range(n)]
        result = DenseOutput(torch.empty_like(self.dense), M, 1)

        def pull() -> None:
            if not result.write_bitmaps(messages, words):
                result.write([(enc.decode(p, members[offsets[j] : offsets[j + 1]], M), v)
                               for j, (p, v) in enumerate(messages)], disjoint=True)

        bp, column = HashPartitions(self.family, 2.0, 0.1), values.view(-1, 1)
        return [self.row("BP push: partition", lambda: bp.group(self.index, column, n, torch.int32, M),
                         nnz=int(self.index.numel())),
                self.row("BP server: sum + encode", server, rows=sum(int(i.numel()) for i, _ in pushed)),
                self.row("BP pull: decode + write", pull, rows=sum(int(v.shape[0]) for _, v in messages))]

    def sweep_rows(self, kind: str, values: tuple[float, ...]) -> list[dict[str, Any]]:
        rows, nnz = [], int(self.index.numel())
        for v in values:
            family = hashing.HashFamily.from_seed(self.family.seed, int(v)) if kind == "k" else self.family
            factor = v if kind == "r1" else self.args.r1_factor
            parts = self._hash(self.index, factor, family)
            rows.append(self.row(f"hash, {kind}={v:g}", lambda f=factor, fam=family: self._hash(self.index, f, fam),
                                 nnz=nnz, r1_factor=factor, k=family.k,
                                 serial_pct=100.0 * parts.serial / max(nnz, 1)))
        return rows


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_table(rows: list[dict[str, Any]]) -> None:
    head = f"{'op':<26} {'native ms':>10} {'torch-op ms':>12} {'speedup':>8} {'GB/s':>7} {'% copy':>7}  note"
    print(head)
    print("-" * len(head))
    for r in rows:
        note = ", ".join(f"{k}={r[k]:.3g}" if isinstance(r[k], float) else f"{k}={r[k]}"
                         for k in ("nnz", "rows", "serial_pct") if k in r)
        speedup = "-" if r.get("speedup") is None else f"{r['speedup']:.1f}x"
        pct = "-" if r.get("pct_of_copy") is None else f"{r['pct_of_copy']:.0f}%"
        print(f"{r['op']:<26} {_fmt(r.get('native_ms'), '10.2f')} {_fmt(r.get('reference_ms'), '12.2f')} "
              f"{speedup:>8} {_fmt(r.get('GBps'), '7.2f')} {pct:>7}  {note}")


def run(args: argparse.Namespace) -> int:
    name = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("CUDA is not available here; use --device cpu")
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    if native.get(device) is None:
        print(f"native kernels unavailable on {device} (ZEN_NATIVE=0 or build failed): timing the torch-op path only")
    bench = Bench(args, device)
    print(f"# {device} ({torch.get_num_threads()} threads), {bench.numel:,} x {args.dtype}, density {args.density:g}"
          f" -> {int(bench.index.numel()):,} non-zeros, n={args.servers}, k={args.k}, r1={args.r1_factor:g}·|G|·d_G")
    if args.sweep == "none":
        rows = bench.main_rows()
    else:
        rows = bench.sweep_rows(args.sweep, tuple(args.values or SWEEPS[args.sweep]))
    print_table(rows)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))
        print(f"wrote {len(rows)} rows to {args.json}")
    return 0
