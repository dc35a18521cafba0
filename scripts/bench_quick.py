"""`make bench-quick`: the loopback table in under two minutes, so a regression shows before it lands.

4 gloo ranks on this machine, a 2^24-element float32 gradient at 1% random density: per scheme the median
time per call (slowest rank) with its 10th-90th percentile, the CPU time per call and rank (all of a rank's
threads), that time over the memory-traffic floor (every rank reading its input and writing its output once,
harness/bench/memory.py), bytes received, and the speedup over dense allreduce in the same run.
Time it on a quiet machine.

    python scripts/bench_quick.py [--repeats 10] [--schemes allreduce,agsparse,zen,zen-bp,zen-hc]
"""

from __future__ import annotations

import argparse
import sys

from harness.bench.harness import BenchConfig, rows, run_dist
from harness.bench.memory import floor_seconds

NUMEL, DENSITY, RANKS = 1 << 24, 0.01, 4


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--schemes", default="allreduce,agsparse,zen,zen-bp,zen-hc")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    floor = floor_seconds(RANKS, NUMEL)
    cfg = BenchConfig(backend="gloo", world_size=RANKS, numel=NUMEL, density=DENSITY, pattern="random",
                      schemes=args.schemes.split(","), repeats=args.repeats, warmup=4)
    table = rows(cfg, run_dist(cfg))
    print(f"# {RANKS} gloo ranks, loopback, 2^24 float32, density {DENSITY}: memory-traffic floor "
          f"{floor * 1e3:.1f} ms (each rank reads and writes 64 MiB)")
    print(f"{'scheme':>10} {'ms':>8} {'p10-p90':>13} {'CPU ms':>8} {'x floor':>8} {'MB recv':>8} {'speedup':>8}")
    for r in table:
        times = sorted(r["times_ms"])
        p10, p90 = times[int(0.1 * (len(times) - 1))], times[int(0.9 * (len(times) - 1))]
        print(f"{r['scheme']:>10} {r['time_ms_median']:8.2f} {p10:6.1f}-{p90:<6.1f} {r['cpu_ms_median']:8.2f} "
              f"{r['time_ms_median'] / (floor * 1e3):8.2f} {r['bytes_received_max'] / 1e6:8.3f} "
              + (f"{r['speedup_vs_allreduce']:7.2f}x" if r["speedup_vs_allreduce"] else f"{'-':>8}")
              + ("" if r["correct"] else "  WRONG"))
    return 0 if all(r["correct"] for r in table) else 1


if __name__ == "__main__":
    sys.exit(main())
