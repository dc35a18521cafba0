"""`zen bench`: one table row per scheme, JSON lines with --json, non-zero exit on a wrong result."""

from __future__ import annotations

import argparse

import torch.distributed as dist

from harness.bench.harness import DTYPES, BenchConfig, run_bench
from harness.bench.patterns import PATTERNS
from harness.bench.report import json_lines, markdown, table
from harness.netem import rate
from harness.provenance import write_atomic
from zen.cli_args import UsageError, count, positive_int
from zen.compress import sparsifiers
from zen.encodings import encodings
from zen.registry import schemes


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=("sim", "gloo", "nccl"), default="sim")
    p.add_argument("--world-size", "-n", type=positive_int, default=4)
    p.add_argument("--schemes", default="all", help="comma-separated scheme names, or 'all'")
    p.add_argument("--numel", type=count, default=1 << 20, help="elements (2^20, 1e6, ...)")
    p.add_argument("--density", type=float, default=0.01)
    p.add_argument("--pattern", choices=PATTERNS, default="random")
    p.add_argument("--compress", default=None,
                   help=f"inputs are what this compressor of --density chooses from a dense gradient, half shared "
                        f"by all ranks (--pattern is then unused): {', '.join(sparsifiers())}")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    p.add_argument("--repeats", type=positive_int, default=10)
    p.add_argument("--warmup", type=int, default=4,
                   help="untimed calls first (zen times BP and HC twice each, then keeps the faster)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bandwidth", type=rate, default=None, help="gloo only: emulated per-node link rate, e.g. 1gbit")
    p.add_argument("--sim-bandwidth-gbps", type=float, default=25.0, help="sim only: link rate for times")
    p.add_argument("--in-place", action="store_true",
                   help="output into the input buffer, as DDP's buckets are (refilled before each untimed barrier)")
    p.add_argument("--ranks-per-node", type=positive_int, default=1,
                   help="nodes of this many consecutive ranks (one namespace each with --bandwidth), synced "
                        "two-level: dense inside a node, the scheme across nodes")
    p.add_argument("--intra", choices=("dense", "sparse"), default="dense",
                   help="with --ranks-per-node: the node steps, dense as the paper's (NVLink) or sparse rows")
    p.add_argument("--flat", action="store_true",
                   help="with --ranks-per-node (gloo, nccl): keep the nodes but sync flat over all ranks")
    p.add_argument("--pull", default=None, help=f"pull encoding for zen schemes ({', '.join(encodings())})")
    p.add_argument("--json", default=None, help="write one JSON object per row to this file")
    p.add_argument("--markdown", default=None, help="write the table as markdown to this file")


def config_from(args: argparse.Namespace) -> BenchConfig:
    names = schemes() if args.schemes == "all" else [s.strip() for s in args.schemes.split(",") if s.strip()]
    unknown = sorted(set(names) - set(schemes()))
    if unknown:
        raise UsageError(f"unknown scheme(s) {unknown}; choose from {', '.join(schemes())}")
    if "allreduce" in names:  # the reference first, so speedups read top-down
        names.remove("allreduce")
        names.insert(0, "allreduce")
    if not 0.0 <= args.density <= 1.0:
        raise UsageError(f"--density must be in [0, 1], got {args.density}")
    if args.backend == "nccl" and not (dist.is_available() and dist.is_nccl_available()):
        raise UsageError("--backend nccl: this torch has no NCCL (a CPU build); use gloo or sim")
    if args.bandwidth and args.backend == "sim":
        raise UsageError("--bandwidth needs --backend gloo (sim uses --sim-bandwidth-gbps)")
    if args.compress is not None and args.compress not in sparsifiers():
        raise UsageError(f"--compress {args.compress}: choose a sparsifier ({', '.join(sparsifiers())}); a "
                         f"quantizer brings its own exchange, no scheme to compare")
    if args.world_size % args.ranks_per_node:
        raise UsageError(f"--ranks-per-node {args.ranks_per_node} must divide --world-size {args.world_size} "
                         f"(equal nodes)")
    if args.flat and (args.ranks_per_node == 1 or args.backend == "sim"):
        raise UsageError("--flat keeps nodes of --ranks-per-node > 1 ranks on a real backend (gloo, nccl)")
    options = {}
    if args.pull:
        options = {n: {"pull": args.pull} for n in names if n in ("zen", "zen-bp")}
    return BenchConfig(
        backend=args.backend, world_size=args.world_size, schemes=names, numel=args.numel,
        density=args.density, pattern=args.pattern, dtype=args.dtype, repeats=args.repeats,
        warmup=args.warmup, seed=args.seed, bandwidth=args.bandwidth,
        sim_bandwidth_gbps=args.sim_bandwidth_gbps, in_place=args.in_place, options=options,
        compress=args.compress, ranks_per_node=args.ranks_per_node, flat=args.flat, intra=args.intra,
    )



def run(args: argparse.Namespace) -> int:
    rows = run_bench(config_from(args))
    print(table(rows))
    if args.json:
        write_atomic(args.json, json_lines(rows))
    if args.markdown:
        write_atomic(args.markdown, markdown(rows))
    return 0 if all(r["correct"] for r in rows) else 1

