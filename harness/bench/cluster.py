"""`zen cluster`: a workload's communication time per step on a cluster it never ran on (Fig 15 by model).

The paper's Fig 15 is 16 machines x 8 GPUs at 25 Gbps. From a `zen profile` run (every worker's non-zero
rows per sparse parameter, and the dense parameters' size) this predicts, for every scheme, one step's
communication time there:
- bytes: each sparse parameter through the scheme's exact `predict` on the trace's first N workers (with
  its own row width), two-level when a node has more than one GPU: dense reduce-scatter and all-gather on
  the intra-node link, the scheme across nodes per shard on the node's uplink, which its GPUs share; the
  dense parameters by two-level ring all-reduce (every scheme routes them there);
- time: the busiest rank's intra-node bytes over the intra-node rate, plus the busiest node's uplink bytes
  over the uplink rate, plus alpha per message, plus, for sparse schemes, local work: the elements of the
  table shard a rank reads, over a measured rate (`--local-rate`: "measure" times this machine's native
  row extraction; "v100" is the paper's ~6 ms to hash 214M elements; or elements per second).
`--emulated N,...` adds the same model at the emulated cluster's setting (N ranks, one per node, at
`--emulated-bandwidth`, local work at this machine's rate), to hold against measured training.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from harness.netem import parse_rate
from harness.provenance import write_csv
from zen import costmodel
from zen.cli_args import UsageError, positive_int, world_sizes
from zen.grad import extract_rows
from zen.prediction import link_class, predict, uplink_bytes
from zen.registry import make_scheme, schemes
from zen.types import WireLayout

PAPER_V100_RATE = 214e6 / 6e-3  # elements per second: the paper's hashing of 214M elements in ~6 ms (Fig 16)
NVLINK_V100 = "1200gbit"  # ~150 GB/s between two V100s of a DGX-1 node


@dataclass(frozen=True)
class Cluster:
    nodes: int
    gpus_per_node: int
    uplink_bps: float  # bits per second of a node's network link, shared by its GPUs
    intra_bps: float  # bits per second between two GPUs of a node
    local_rate: float  # elements per second of a sparse scheme's local pass over its table shard
    alpha_s: float = 10e-6

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


def measure_local_rate(numel: int = 1 << 24, width: int = 64, density: float = 0.01, repeats: int = 5) -> float:
    """Elements per second of this machine's row extraction (`zen.grad.extract_rows`: the native one-pass
    kernel, or its PyTorch fallback), median of `repeats`."""
    rows = numel // width
    dense = torch.empty(rows, width).zero_()  # written: untouched zero pages would be read from cache
    dense[torch.randperm(rows)[: max(1, int(rows * density))]] = 1.0
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        extract_rows(dense)
        times.append(time.perf_counter() - start)
    return numel / sorted(times)[len(times) // 2]


def load_profile(folder: Path, step: int = -1) -> tuple[list[dict[str, Any]], list[list[torch.Tensor]], int]:
    """(sparse parameters with rows and width, per parameter the workers' row ids at `step`, dense numel)."""
    trace = torch.load(folder / "traces.pt", weights_only=True)
    summary = json.loads((folder / "profile.json").read_text())
    if "dense_numel" not in summary:
        raise UsageError(f"{folder}/profile.json has no dense_numel: profile again with this version")
    per_worker = trace["indices"][step]
    per_param = [[ids[k].long() for ids in per_worker] for k in range(len(trace["params"]))]
    return trace["params"], per_param, int(summary["dense_numel"])


def step_time(scheme: str, params: list[dict[str, Any]], sets: list[list[torch.Tensor]], dense_numel: int,
              cl: Cluster, seed: int = 0) -> dict[str, float]:
    """One step's predicted communication: seconds on the intra-node and uplink links, local work, total."""
    n, k = cl.world_size, cl.gpus_per_node
    intra = uplink = local = 0.0
    messages = 0
    sparse = make_scheme(scheme).sparse_input
    for p, per_worker in zip(params, sets, strict=True):
        layout = WireLayout(world_size=n, rows=int(p["rows"]), width=int(p["width"]), seed=seed)
        per_rank = predict(scheme, per_worker[:n], layout, ranks_per_node=k)
        intra += max(sum(v for ph, v in r.items() if link_class(ph) == "intra") for r in per_rank)
        uplink += max(uplink_bytes(per_rank, k))
        messages += 2 * (cl.nodes - 1) + (2 * (k - 1) if k > 1 else 0)
        if sparse:
            local += int(p["rows"]) * int(p["width"]) / k / cl.local_rate
    dense = costmodel.Sparsity(n=n, rows=dense_numel, density=1.0, gamma=lambda m: 1.0)
    allreduce = lambda s: costmodel.closed_form("allreduce", s)  # noqa: E731 - a form for two_level_cost
    dense_intra, dense_inner = costmodel.two_level_cost(dense, k, allreduce) if k > 1 else (0.0, allreduce(dense))
    intra += dense_intra
    uplink += k * dense_inner.bytes_received
    intra_s = 8 * intra / cl.intra_bps if k > 1 else 0.0
    uplink_s = 8 * uplink / cl.uplink_bps
    total = intra_s + uplink_s + local + messages * cl.alpha_s
    return {"intra_s": intra_s, "uplink_s": uplink_s, "local_s": local, "comm_s": total,
            "uplink_bytes": uplink, "intra_bytes": intra}


def table(names: list[str], params: list[dict[str, Any]], sets: list[list[torch.Tensor]], dense_numel: int,
          cl: Cluster, setting: str) -> list[dict[str, Any]]:
    rows = [{"scheme": s, **step_time(s, params, sets, dense_numel, cl)} for s in names]
    base = next(r["comm_s"] for r in rows if r["scheme"] == "allreduce")
    for r in rows:
        r.update(speedup=base / r["comm_s"], setting=setting, nodes=cl.nodes, gpus_per_node=cl.gpus_per_node,
                 world_size=cl.world_size, uplink_gbps=cl.uplink_bps / 1e9, local_rate=cl.local_rate)
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", type=Path, required=True, help="a `zen profile --out` folder (as many workers "
                   "as the cluster has GPUs: --rows-from ids makes 128 cheap)")
    p.add_argument("--workload", default=None, help="name to put in the rows (default: the profile's)")
    p.add_argument("--schemes", default="all")
    p.add_argument("--nodes", type=positive_int, default=16)
    p.add_argument("--gpus-per-node", type=positive_int, default=8)
    p.add_argument("--bandwidth", default="25gbit", help="a node's uplink rate")
    p.add_argument("--intra-bandwidth", default=NVLINK_V100, help="GPU-to-GPU rate inside a node")
    p.add_argument("--local-rate", default="v100", help='"measure", "v100" (the paper\'s hashing rate) or '
                   "elements per second of a sparse scheme's local pass")
    p.add_argument("--emulated", type=world_sizes, default=[], help="also model these world sizes of the "
                   "emulated cluster (one rank per node), to compare with measured training")
    p.add_argument("--emulated-bandwidth", default="1gbit")
    p.add_argument("--embedding-params", type=float, default=None, help="lay the trace's rows out as tables of "
                   "this many parameters in all (width = it / rows: the paper's Table 1 size on a paper-density "
                   "trace, as the step simulator does); default: the profiled widths")
    p.add_argument("--csv", default=None)


def _rate(text: str) -> float:
    if text == "measure":
        return measure_local_rate()
    if text == "v100":
        return PAPER_V100_RATE
    try:
        rate = float(text)
    except ValueError:
        raise UsageError(f"--local-rate {text!r}: give measure, v100 or elements per second") from None
    if rate <= 0:
        raise UsageError(f"--local-rate must be positive, got {text}")
    return rate


def run(args: argparse.Namespace) -> int:
    names = schemes() if args.schemes == "all" else args.schemes.split(",")
    unknown = sorted(set(names) - set(schemes()))
    if unknown:
        raise UsageError(f"unknown scheme(s) {unknown}; choose from {', '.join(schemes())}")
    names = names if "allreduce" in names else ["allreduce", *names]
    try:
        uplink, intra = parse_rate(args.bandwidth), parse_rate(args.intra_bandwidth)
        emulated_bps = parse_rate(args.emulated_bandwidth)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    params, sets, dense_numel = load_profile(args.profile)
    if args.embedding_params:
        width = max(1, round(args.embedding_params / sum(int(p["rows"]) for p in params)))
        params = [{**p, "width": width} for p in params]
    workload = args.workload or json.loads((args.profile / "profile.json").read_text())["workload"]
    cl = Cluster(args.nodes, args.gpus_per_node, uplink, intra, _rate(args.local_rate))
    workers = len(sets[0])
    if workers < cl.world_size or any(n > workers for n in args.emulated):
        raise UsageError(f"the profile has {workers} workers: too few for {max([cl.world_size, *args.emulated])} "
                         f"ranks")
    rows = table(names, params, sets, dense_numel, cl, f"model {cl.nodes}x{cl.gpus_per_node}")
    here = 0.0  # this machine's rate, for the emulated cells: measured once
    if args.emulated:
        here = cl.local_rate if args.local_rate == "measure" else measure_local_rate()
    for n in args.emulated:
        rows += table(names, params, sets, dense_numel, Cluster(n, 1, emulated_bps, intra, here),
                      f"model emulated {n}")
    for r in rows:
        r["workload"] = workload
        print(f"{r['setting']:>18} {r['scheme']:>11}  comm {1e3 * r['comm_s']:9.2f} ms  (uplink "
              f"{1e3 * r['uplink_s']:8.2f}, intra {1e3 * r['intra_s']:6.2f}, local {1e3 * r['local_s']:6.2f})  "
              f"speedup over AllReduce {r['speedup']:6.2f}x")
    if args.csv:
        write_csv(args.csv, rows)
    return 0
