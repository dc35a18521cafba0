"""Two-level against flat sync of one scheme, call by call in one launch, on the emulated cluster.

    python scripts/twolevel_ab.py -n 8 --ranks-per-node 2 --bandwidth 1gbit      # 4 nodes x 2 ranks
    python scripts/twolevel_ab.py -n 4 --ranks-per-node 2 --intra dense --scheme allreduce

The two modes alternate on the same ranks and inputs (ABAB..., the order flipped every pair, a barrier
before each call), so machine drift hits both alike, unlike two `zen bench` runs minutes apart. Each row is
the median over calls of the slowest rank's time, with the 25th-75th percentile, the busiest node's uplink
bytes per call (exact, from the communicator's counts) and the ratio to flat from the same launch. Time it
on a quiet machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from harness.bench.harness import BenchConfig, inputs
from harness.bench.patterns import PATTERNS
from harness.launch import spawn
from harness.netem import rate
from zen.cli_args import count
from zen.prediction import uplink_bytes
from zen.registry import make_scheme, schemes
from zen.twolevel import INTRA_MODES, settling_calls

MODES = ("flat", "two-level")


def compare(scheme: str, numel: int, density: float, pattern: str, ranks_per_node: int, intra: str, calls: int,
            warmup: int) -> dict[str, Any]:
    """One rank: `warmup` + `calls` pairs of calls, flat and two-level alternating; per mode its call times
    (s) and its received bytes per phase in the last call."""
    import torch.distributed as dist

    from zen.api import sync
    from zen.comm import scheduling
    from zen.comm.dist import DistComm
    from zen.twolevel import dist_node_comms

    comm = DistComm()
    nodes = dist_node_comms(ranks_per_node, mode=intra)
    scheduling.calm_gloo(dist.get_backend())
    cfg = BenchConfig(world_size=comm.world_size, schemes=[scheme], numel=numel, density=density, pattern=pattern)
    grad = inputs(cfg, comm.rank)
    out = torch.empty_like(grad)
    instances = {mode: make_scheme(scheme) for mode in MODES}  # per-size state (zen's BP / HC choice) apart
    warmup = max(warmup, settling_calls(instances["two-level"], comm, nodes),  # time only the paths they keep
                 settling_calls(instances["flat"], comm))
    got: dict[str, Any] = {mode: {"times": [], "received": {}} for mode in MODES}
    for i in range(warmup + calls):
        for mode in MODES if i % 2 else MODES[::-1]:
            dist.barrier()
            start = time.perf_counter()
            _, stats = sync(instances[mode], grad, comm, out, nodes=None if mode == "flat" else nodes)
            if i >= warmup:
                got[mode]["times"].append(time.perf_counter() - start)
                got[mode]["received"] = dict(stats.traffic.received)
    return got


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--world-size", type=int, default=8)
    parser.add_argument("--ranks-per-node", type=int, default=2)
    parser.add_argument("--bandwidth", type=rate, default="1gbit", help="emulated per-node uplink rate")
    parser.add_argument("--scheme", default="zen", choices=schemes())
    parser.add_argument("--intra", default="sparse", choices=INTRA_MODES, help="two-level's node steps")
    parser.add_argument("--numel", type=count, default=2**23, help="elements (2^23, 1e6, ...)")
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--pattern", default="zipf", choices=sorted(PATTERNS))
    parser.add_argument("--calls", type=int, default=60, help="timed calls per mode")
    parser.add_argument("--warmup", type=int, default=4, help="untimed pairs, at least the calls spent choosing paths")
    args = parser.parse_args(argv)
    k, P = args.ranks_per_node, args.world_size
    if k < 2 or P % k or k == P:
        parser.error(f"--ranks-per-node must be >= 2 and divide --world-size into >= 2 nodes, got {k} and {P}")
    if args.calls < 2 or args.warmup < 0 or not 0 < args.density <= 1:
        parser.error("--calls >= 2, --warmup >= 0 and --density in (0, 1]")

    from harness.netem import emulated_cluster

    kwargs = {"scheme": args.scheme, "numel": args.numel, "density": args.density, "pattern": args.pattern,
              "ranks_per_node": k, "intra": args.intra, "calls": args.calls, "warmup": args.warmup}
    here = {"PYTHONPATH": str(Path(__file__).resolve().parent)}
    with emulated_cluster(P, args.bandwidth, ranks_per_node=k) as cluster:
        where = cluster.spawn_kwargs()
        node_env = where.pop("env", None)
        results = spawn("twolevel_ab:compare", P, kwargs, timeout_s=3600,
                        env=lambda r: {**(node_env(r) if node_env else {}), **here}, **where)
    print(f"{args.scheme}, {P // k} nodes x {k} ranks, {args.bandwidth} per node, {args.numel} elements, "
          f"{args.density:g} {args.pattern}, two-level node steps {args.intra}; {args.calls} calls per mode, "
          f"interleaved")
    print(f"{'sync':>10} {'ms':>8} {'p25':>8} {'p75':>8} {'uplink MB':>10} {'vs flat':>8}")
    medians = {}
    for mode in MODES:
        worst = [max(r[mode]["times"][i] for r in results) * 1e3 for i in range(args.calls)]
        q25, _, q75 = statistics.quantiles(worst, n=4)
        medians[mode] = statistics.median(worst)
        uplink = max(uplink_bytes([r[mode]["received"] for r in results], k)) / 1e6
        print(f"{mode:>10} {medians[mode]:8.1f} {q25:8.1f} {q75:8.1f} {uplink:10.3f} "
              f"{medians[mode] / medians['flat']:7.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
