"""Wall and CPU time of each stage of a steady-state sync call, on every loopback gloo rank.

    python scripts/stage_times.py [--schemes zen-bp,zen-hc] [--numel 2^24] [--density 0.01] [--calls 12]

Each stage's function is wrapped with perf_counter, process_time (all of a rank's threads) and the process's minor
page faults while one scheme instance syncs the benchmark's input `--warmup` + `--calls` times (a barrier before
each; the warm-up is at least the calls the scheme spends choosing its path). Printed per scheme and stage: the
per-call median over the timed calls, wall ms / CPU ms / page faults (fresh pages touched: memory the allocator
gave back and took again), one column per rank. A stage a call enters twice counts twice, and a stage inside
another is also in the outer one's time. Unlike scripts/profile_local_work.py (py-spy samples), nothing is
attributed by frame names; the timers cost a few microseconds a stage. Time it on a quiet machine.
"""

from __future__ import annotations

import argparse
import collections
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.launch import spawn
from zen.cli_args import count
from zen.registry import schemes

# (row, module, attribute path): the functions that make a call's stages, outermost last where they nest
STAGES = [
    ("extract", "zen.grad", "LocalGrad.rows"),
    ("input check", "zen.core.synchronizer", "check_parts"),
    ("partition", "zen.algorithms.partitions", "HashPartitions.group"),
    ("all-to-all", "zen.comm.dist", "DistComm.all_to_all_v"),
    ("exchange", "zen.comm.dist", "DistComm.exchange"),
    ("all-gather", "zen.comm.dist", "DistComm.all_gather_v"),
    ("server", "zen.algorithms.bp", "BalancedParallelism.aggregate"),
    ("merge", "zen.algorithms.hc", "merge_rows"),
    ("write", "zen.output", "DenseOutput.write"),
    ("decode + write", "zen.output", "DenseOutput.write_bitmaps"),
]


def _faults() -> int:
    """Minor page faults of this process so far (all threads): a fresh page's first touch."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _now() -> tuple[float, float, int]:
    return time.perf_counter(), time.process_time(), _faults()


def _since(start: tuple[float, float, int]) -> tuple[float, float, int]:
    return tuple(b - a for a, b in zip(start, _now(), strict=True))  # type: ignore[return-value]


def _timed(fn: Callable[..., Any], spent: list[tuple[float, float, int]]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = _now()
        try:
            return fn(*args, **kwargs)
        finally:
            spent.append(_since(start))
    return timed


def measure(scheme: str, numel: int, density: float, calls: int,
            warmup: int) -> dict[str, tuple[float, float, float]]:
    """One rank: per stage (and "call"), the median over timed calls of its wall and CPU seconds and its minor
    page faults in a call."""
    import importlib

    import torch
    import torch.distributed as dist

    from harness.bench.harness import BenchConfig, inputs
    from zen.api import sync
    from zen.comm.dist import DistComm
    from zen.registry import make_scheme
    from zen.twolevel import settling_calls

    comm = DistComm()
    grad = inputs(BenchConfig(world_size=comm.world_size, schemes=[scheme], numel=numel, density=density,
                              pattern="random"), comm.rank)
    out = torch.empty_like(grad)
    spent: dict[str, list[tuple[float, float, int]]] = collections.defaultdict(list)
    for row, module, path in STAGES:
        owner: Any = importlib.import_module(module)
        *outer, name = path.split(".")
        for part in outer:
            owner = getattr(owner, part)
        setattr(owner, name, _timed(getattr(owner, name), spent[row]))
    instance = make_scheme(scheme)
    warmup = max(warmup, settling_calls(instance, comm))
    per_call: dict[str, list[tuple[float, float, int]]] = collections.defaultdict(list)
    for i in range(warmup + calls):
        for times in spent.values():
            times.clear()
        dist.barrier()
        start = _now()
        sync(instance, grad, comm, out)
        if i >= warmup:
            per_call["call"].append(_since(start))
            for row, times in spent.items():
                per_call[row].append(tuple(sum(t[k] for t in times) for k in range(3)))  # type: ignore[arg-type]
    return {row: tuple(statistics.median(t[k] for t in got) for k in range(3))  # type: ignore[misc]
            for row, got in per_call.items() if any(t[0] for t in got)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schemes", default="zen-bp,zen-hc")
    parser.add_argument("-n", "--world-size", type=int, default=4)
    parser.add_argument("--numel", type=count, default=2**24, help="elements (2^24, 1e6, ...)")
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--calls", type=int, default=12, help="timed calls")
    parser.add_argument("--warmup", type=int, default=8, help="untimed calls, at least those spent choosing paths")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.schemes.split(",")) - set(schemes()))
    if unknown or args.world_size < 1 or args.calls < 1 or args.warmup < 0 or not 0 < args.density <= 1:
        parser.error(f"need known schemes (not {unknown}), -n >= 1, --calls >= 1, --warmup >= 0 and --density "
                     f"in (0, 1]")
    here = {"PYTHONPATH": str(Path(__file__).resolve().parent)}
    print(f"# {args.world_size} gloo ranks, loopback, {args.numel} elements, density {args.density} random: wall ms / "
          f"CPU ms / minor page faults per call, median of {args.calls} calls, ranks 0..{args.world_size - 1}")
    for scheme in args.schemes.split(","):
        kwargs = {"scheme": scheme, "numel": args.numel, "density": args.density, "calls": args.calls,
                  "warmup": args.warmup}
        ranks = spawn("stage_times:measure", args.world_size, kwargs, timeout_s=1800, env=lambda _: here)
        print(f"== {scheme}")
        for row in [r for r, _, _ in STAGES if r in ranks[0]] + ["call"]:
            cells = "  ".join(f"{1e3 * got[row][0]:7.2f} / {1e3 * got[row][1]:6.2f} / {got[row][2]:5.0f}"
                              for got in ranks)
            print(f"{row:>15}  {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
