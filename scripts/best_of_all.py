"""Zen against the best other scheme, cell by cell, with the plan zen chose (issue 52's "best of all" grid).

Each cell is two `zen bench` launches on real gloo ranks running every registered scheme but zen's single-plan
variants (`zen-*`), the second in the reverse order, their calls pooled per scheme: within a launch a scheme's
place moves its time (the last of ten schemes ran up to 1.2x slower than when it ran first, zen and AGsparse
alike), and both orders cancel that. A cell passes where zen's median call (slowest rank) is at most 1.02x the
best other scheme's, or where their 25th-75th percentile spreads overlap. Time it on a quiet machine.

    python scripts/best_of_all.py --ranks 4 --sizes 20,22,24 --densities 0.001,0.01,0.1 --patterns random,zipf
    python scripts/best_of_all.py --ranks 2,4,8 --bandwidths 1gbit,2.5gbit --sizes 22 --densities 0.01 --csv out.csv
    python scripts/best_of_all.py --ranks 8 --ranks-per-node 2 --bandwidths 1gbit --sizes 22 --densities 0.01

With `--ranks-per-node k` every scheme runs two-level sync on nodes of k ranks (the emulated cluster shapes each
node's uplink), the node steps as each scheme's default (`intra="auto"`).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import statistics
import sys
from typing import Any

from harness.bench.harness import BenchConfig, run_dist
from harness.bench.harness import rows as bench_rows
from harness.bench.patterns import PATTERNS
from harness.netem import rate
from harness.provenance import write_csv
from zen.registry import schemes

MARGIN = 1.02  # zen may take this much of the best other scheme's time and still count as the best


def rivals() -> list[str]:
    """Every registered scheme but zen and its single-plan variants: a baseline added in one file joins the grid."""
    return [s for s in schemes() if not s.startswith("zen")]


def quartiles(times: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(times, n=4, method="inclusive")
    return q[0], q[2]


def judge(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Zen's row against the fastest other row of one cell."""
    zen = next(r for r in rows if r["scheme"] == "zen")
    best = min((r for r in rows if r["scheme"] != "zen"), key=lambda r: r["time_ms_median"])
    (z25, z75), (b25, b75) = quartiles(zen["times_ms"]), quartiles(best["times_ms"])
    ratio = zen["time_ms_median"] / best["time_ms_median"]
    overlap = z25 <= b75 and b25 <= z75
    return {"zen_ms": zen["time_ms_median"], "zen_p25": z25, "zen_p75": z75, "best": best["scheme"],
            "best_ms": best["time_ms_median"], "best_p25": b25, "best_p75": b75, "ratio": ratio,
            "zen_plan": zen["choice"], "passes": ratio <= MARGIN or overlap,
            "correct": all(r["correct"] for r in rows)}


def pooled(launches: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each scheme's calls over the launches as one row: its times together, their median, the plans zen kept,
    and correct only where every launch was."""
    out: dict[str, dict[str, Any]] = {}
    for rows in launches:
        for r in rows:
            got = out.setdefault(r["scheme"], {"scheme": r["scheme"], "times_ms": [], "choices": [], "correct": True})
            got["times_ms"] += r["times_ms"]
            got["choices"].append(r["choice"])
            got["correct"] = got["correct"] and r["correct"]
    for got in out.values():
        got["time_ms_median"] = statistics.median(got["times_ms"])
        got["choice"] = "/".join(dict.fromkeys(str(c) for c in got.pop("choices")))
    return list(out.values())


def both_orders(cfg: BenchConfig) -> list[dict[str, Any]]:
    """The cell launched with its schemes in order and in reverse, pooled."""
    reverse = dataclasses.replace(cfg, schemes=cfg.schemes[::-1])
    return pooled([bench_rows(c, run_dist(c)) for c in (cfg, reverse)])


def cells(args: argparse.Namespace) -> list[BenchConfig]:
    grid = itertools.product(args.ranks, args.bandwidths, args.sizes, args.densities, args.patterns)
    return [BenchConfig(backend="gloo", world_size=n, numel=1 << k, density=d, pattern=p, repeats=args.repeats,
                        warmup=args.warmup, bandwidth=None if b == "loopback" else b, seed=args.seed,
                        ranks_per_node=args.ranks_per_node,
                        schemes=["allreduce", *[s for s in rivals() if s != "allreduce"], "zen"])
            for n, b, k, d, p in grid]


def parse(argv: list[str] | None) -> argparse.Namespace:
    ints = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=ints, default=[4], help="world sizes, comma-separated")
    p.add_argument("--bandwidths", type=lambda t: [b if b == "loopback" else rate(b) for b in t.split(",")],
                   default=["loopback"],
                   help="emulated link rates (as root), comma-separated, or loopback")
    p.add_argument("--sizes", type=ints, default=[20, 22, 24], help="log2 of the elements per tensor")
    p.add_argument("--densities", type=lambda t: [float(x) for x in t.split(",")], default=[0.001, 0.01, 0.1])
    p.add_argument("--patterns", default="random,zipf")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--warmup", type=int, default=4, help="untimed calls (zen's measuring and trial calls)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ranks-per-node", type=int, default=1, help="two-level sync on nodes of this many ranks")
    p.add_argument("--csv", default=None, help="write one row per cell here")
    args = p.parse_args(argv)
    args.patterns = args.patterns.split(",")
    if unknown := sorted(set(args.patterns) - set(PATTERNS)):
        p.error(f"unknown pattern(s) {unknown}; choose from {', '.join(PATTERNS)}")
    if args.repeats < 4 or min(args.ranks) < 2:
        p.error("need --repeats >= 4 (quartiles) and --ranks >= 2")
    if args.ranks_per_node < 1 or any(n % args.ranks_per_node for n in args.ranks):
        p.error(f"--ranks-per-node must be >= 1 and divide every --ranks, got {args.ranks_per_node}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    out = []
    print("| ranks | link | elements | density | pattern | zen ms (p25-p75) | best other ms (p25-p75) | zen / best "
          "| zen's plan | verdict |\n|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for cfg in cells(args):
        k = cfg.ranks_per_node
        ranks = cfg.world_size if k == 1 else f"{cfg.world_size // k} x {k}"
        row = {"ranks": ranks, "link": cfg.bandwidth or "loopback", "elements": cfg.numel,
               "density": cfg.density, "pattern": cfg.pattern, **judge(both_orders(cfg))}
        out.append(row)
        verdict = ("best" if row["passes"] else "LOSES") + ("" if row["correct"] else ", WRONG")
        print(f"| {ranks} | {row['link']} | 2^{cfg.numel.bit_length() - 1} | {cfg.density:g} | {cfg.pattern} "
              f"| {row['zen_ms']:.2f} ({row['zen_p25']:.1f}-{row['zen_p75']:.1f}) | {row['best']} "
              f"{row['best_ms']:.2f} ({row['best_p25']:.1f}-{row['best_p75']:.1f}) | {row['ratio']:.2f}x "
              f"| {row['zen_plan']} | {verdict} |", flush=True)
    if args.csv:
        write_csv(args.csv, out)
    return 0 if all(r["passes"] and r["correct"] for r in out) else 1


if __name__ == "__main__":
    sys.exit(main())
