"""Accuracy of the emulated cluster (harness/netem.py): dense gloo all_reduce time over the ring bound.

Usage: python scripts/netem_check.py [--rate 1gbit] [--ranks 2 4] [--mb 10 100] [--iters 5]
Prints one row per (ranks, size): median and min seconds over `iters` (max over ranks per iteration),
the ring bound 2(n-1)/n * S/B, and median / bound. Needs root or unprivileged user namespaces.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from harness.launch import spawn
from harness.netem import emulated_cluster, parse_rate, ring_allreduce_seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="1gbit", help="per-link rate, e.g. 1gbit, 500mbit, 1e9")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--mb", type=float, nargs="+", default=[10, 100], help="message sizes in 1e6 bytes")
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args(argv)
    rate = parse_rate(args.rate)
    print(f"dense gloo all_reduce of float32, links at {rate / 1e9:g} Gbit/s, median of {args.iters}")
    print(f"{'ranks':>5} {'MB':>6} {'median s':>9} {'min s':>7} {'ring s':>7} {'ratio':>6}")
    for n in args.ranks:
        with emulated_cluster(n, rate) as spec:
            for mb in args.mb:
                nbytes = int(mb * 1e6)
                per_rank = spawn("harness.netem:time_allreduce", n, {"nbytes": nbytes, "iters": args.iters},
                                 **spec.spawn_kwargs())
                times = per_rank[0]  # every rank returns the same max-over-ranks times
                bound = ring_allreduce_seconds(nbytes, n, rate)
                med = statistics.median(times)
                print(f"{n:>5} {mb:>6g} {med:>9.3f} {min(times):>7.3f} {bound:>7.3f} {med / bound:>5.2f}x",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
