"""`zen scale`: communication at 2..128 ranks for every scheme (the data of the paper's Figure 8).

For each world size n the ranks' non-zero row sets come from a synthetic pattern (fixed per-rank
density, as with a fixed per-GPU batch) or from a profiled workload trace; every scheme's exact
per-rank traffic is then predicted from those sets (the same `predict` the tests hold equal to the
simulated bytes), and the algorithmic communication time is the busiest rank's received bytes over
the link bandwidth, normalised to dense AllReduce. "bp-without-index" is the paper's ideal line.
`--verify` also runs the real simulation at the smaller sizes and checks bytes match.
"""

from __future__ import annotations

import argparse
import json
from functools import lru_cache
from typing import Any

import torch

import zen
from harness.bench.patterns import PATTERNS, index_set, make_gradient
from harness.provenance import write_atomic, write_csv
from zen import costmodel
from zen.cli_args import UsageError, count, world_sizes
from zen.prediction import predict, totals
from zen.registry import schemes
from zen.types import WireLayout

IDEAL = "bp-without-index"


def replay_sets(trace: dict[str, Any], step: int = -1) -> dict[str, Any]:
    """A `zen profile` trace (row ids per step, worker and sparse parameter) as one set per worker in a
    single row space, {"rows": M, "sets": [...]}: parameters stacked in order, one step (the last by
    default: the model has trained a little, as in the paper's measurements)."""
    rows = [int(p["rows"]) for p in trace["params"]]
    offsets = [sum(rows[:k]) for k in range(len(rows))]
    sets = [torch.cat([ids.long() + off for ids, off in zip(per_param, offsets, strict=True)]).unique()
            for per_param in trace["indices"][step]]
    return {"rows": sum(rows), "sets": sets}


def load_trace(path: str, step: int = -1) -> tuple[int, list[torch.Tensor]]:
    """A trace file: the replay format torch.save({"rows": M, "sets": [int64 row ids per worker, ...]}),
    or the traces.pt that `zen profile` writes (converted by `replay_sets`)."""
    data = torch.load(path, weights_only=True)
    if "rows" not in data:
        if "indices" not in data:
            raise UsageError(f"--trace {path}: neither a replay trace nor a `zen profile` traces.pt")
        data = replay_sets(data, step)
    return int(data["rows"]), [s.long() for s in data["sets"]]


def sets_for(args: argparse.Namespace, n: int) -> tuple[int, list[torch.Tensor]] | None:
    if args.trace:
        rows, sets = load_trace(args.trace, args.trace_step)
        return (rows, sets[:n]) if len(sets) >= n else None
    if args.pattern == "disjoint":
        return args.numel, [index_set(args.pattern, args.numel, args.density, r, n, args.seed) for r in range(n)]
    return args.numel, [_rank_set(args.pattern, args.numel, args.density, r, args.seed) for r in range(n)]


@lru_cache(maxsize=512)
def _rank_set(pattern: str, numel: int, density: float, rank: int, seed: int) -> torch.Tensor:
    """Random and zipf sets depend on the rank only, so world sizes share them (fixed per-GPU batch)."""
    return index_set(pattern, numel, density, rank, 1, seed)


def rows_for(n: int, rows: int, sets: list[torch.Tensor], names: list[str], args: argparse.Namespace
             ) -> list[dict[str, Any]]:
    layout = WireLayout(world_size=n, rows=rows, seed=args.seed)
    bandwidth = args.bandwidth_gbps * 1e9 / 8
    mean_nnz = sum(int(s.numel()) for s in sets) / n
    union = int(torch.unique(torch.cat(sets)).numel())
    gamma_n = union / mean_nnz if mean_nnz else 1.0
    out = []
    for name in names:
        received = totals(predict(name, sets, layout))
        out.append({"scheme": name, "world_size": n, "bytes_received_max": max(received),
                    "bytes_received_mean": sum(received) / n})
    ideal = costmodel.bp_without_index(costmodel.Sparsity(
        n=n, rows=rows, density=mean_nnz / rows, gamma=lambda m: gamma_n))
    out.append({"scheme": IDEAL, "world_size": n, "bytes_received_max": ideal.bytes_received,
                "bytes_received_mean": ideal.bytes_received})
    base = next(r["bytes_received_max"] for r in out if r["scheme"] == "allreduce")
    for r in out:
        r.update(time_ms=1e3 * r["bytes_received_max"] / bandwidth, normalized=r["bytes_received_max"] / base,
                 density=mean_nnz / rows, union_density=union / rows, gamma_n=gamma_n, rows=rows,
                 source=args.trace or args.pattern, bandwidth_gbps=args.bandwidth_gbps)
    return out


def verify(n: int, args: argparse.Namespace, names: list[str], table: list[dict[str, Any]]) -> None:
    """Run the real simulation and require the predicted bytes, exactly."""
    grads = [make_gradient(args.pattern, args.numel, args.density, r, n, args.seed) for r in range(n)]
    for name in names:
        res = zen.simulate(name, grads, warmup=1, seed=args.seed)
        want = next(r["bytes_received_max"] for r in table if r["scheme"] == name and r["world_size"] == n)
        if max(res.bytes_received) != want:
            raise UsageError(f"{name} at n={n}: simulated {max(res.bytes_received)} != predicted {want}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--schemes", default="all")
    p.add_argument("--world-sizes", type=world_sizes, default="2,4,8,16,32,64,128")
    p.add_argument("--numel", type=count, default=1 << 22)
    p.add_argument("--density", type=float, default=0.0247, help="per-rank density (default: NMT, 2.47%%)")
    p.add_argument("--pattern", choices=PATTERNS, default="zipf")
    p.add_argument("--trace", default=None, help="replay a profiled trace (zen profile's traces.pt, or the "
                   "replay format) instead of a synthetic pattern")
    p.add_argument("--trace-step", type=int, default=-1, help="which profiled step of a traces.pt to replay")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bandwidth-gbps", type=float, default=25.0)
    p.add_argument("--verify-up-to", type=int, default=0, help="also simulate world sizes <= this and check")
    p.add_argument("--csv", default=None)
    p.add_argument("--json", default=None)


def run(args: argparse.Namespace) -> int:
    names = schemes() if args.schemes == "all" else args.schemes.split(",")
    unknown = sorted(set(names) - set(schemes()))
    if unknown:
        raise UsageError(f"unknown scheme(s) {unknown}; choose from {', '.join(schemes())}")
    if "allreduce" not in names:  # the reference every row is normalized by
        names = ["allreduce", *names]
    if not 0 <= args.density <= 1:
        raise UsageError(f"--density must be in [0, 1], got {args.density}")
    table: list[dict[str, Any]] = []
    for n in args.world_sizes:
        data = sets_for(args, n)
        if data is None:
            print(f"# n={n}: trace has fewer workers, skipped")
            continue
        rows, sets = data
        part = rows_for(n, rows, sets, names, args)
        table += part
        if n <= args.verify_up_to and not args.trace:
            verify(n, args, names, part)
        print(f"n={n:4d}  " + "  ".join(f"{r['scheme']}={r['normalized']:.3f}" for r in part))
    if args.csv:
        write_csv(args.csv, table)
    if args.json:
        write_atomic(args.json, "".join(json.dumps(r) + "\n" for r in table))
    return 0
