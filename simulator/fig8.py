"""Fig 8 with latency and contention: each scheme's sync of the embedding gradient alone, simulated on a flat
cluster (one GPU per machine, the paper's analysis setting) from a paper-density trace.

`zen scale` draws Fig 8 from exact bytes: the busiest rank's bytes received over a link's rate, no latency, no
two flows ever sharing a link. Here the same schemes' messages, recorded from the real code on the trace's row
sets (workers 0..P-1), run on SimGrid at Table 1's size: every message pays the link latency, a ring all-reduce
or all-gather its steps' latency, and flows that meet on a NIC share it (Sparse PS's busiest server, zen's
all-to-all). Local work is left out, as the paper's "algorithmic" communication time leaves it out. Two units:

- `element` (the paper's analysis and `zen scale`'s): each of the trace's rows is one element with its own index,
  recorded at width 1; every message's bytes are then scaled by the width that lays Table 1's embedding
  parameters on the trace's rows: the same pattern and choices at the paper's size (headers scale too, a few
  bytes a message);
- `row`: what the real system sends for an embedding, one id per row of that width (simulator.widths).

Each row carries the byte model's ratio (the busiest rank's bytes received) beside the simulated one, so what
latency and contention change is read off one line.
"""

from __future__ import annotations

from pathlib import Path

from harness.bench.scale import load_trace
from simulator import engine, platform
from simulator.paper import NVLINK_BPS, SETTINGS, paper_width, record_cross, variants
from simulator.record import counted
from simulator.schedule import Comm, Item, Stream
from simulator.widths import tiled
from zen.registry import make_scheme


def sync_calls(scheme: str, options: dict[str, object], sets: list, rows: int, width: int, unit: str
               ) -> list[list[Item]]:
    """Per rank, the messages of one sync of the embedding gradient whose non-zero rows on rank r are sets[r]
    (`unit`: "row", rows of `width`; "element", width-1 rows scaled by `width`): a ring all-reduce for a dense
    scheme, else the real scheme's recorded primitives."""
    if not make_scheme(scheme, **options).sparse_input:
        return [[Comm("all_reduce", "emb", nbytes=4 * rows * width)] for _ in sets]
    shards = [[s] for s in sets]  # one GPU per machine: each machine's one shard is its worker's rows
    if unit == "row":
        return record_cross(scheme, shards, [rows], width, **options)[0]
    return [tiled(items, width) for items in record_cross(scheme, shards, [rows], 1, **options)[0]]


def table(trace: Path, world_sizes: list[int], rate: float, schemes: list[str], workload: str = "gpt2",
          latency_s: float = 10e-6, unit: str = "element") -> list[dict[str, object]]:
    """CSV rows: per world size and scheme, the simulated sync time and its ratio to AllReduce's, beside the
    byte model's ratio (busiest rank's bytes received) at the same width."""
    rows, sets = load_trace(str(trace))
    width = paper_width(SETTINGS[workload], rows)
    names = ["allreduce", *[s for s in schemes if s != "allreduce"]]
    out: list[dict[str, object]] = []
    for world in world_sizes:
        if world > len(sets):
            print(f"# n={world}: the trace has {len(sets)} workers, skipped")
            continue
        plat = platform.gpu_cluster(world, 1, rate, NVLINK_BPS, latency_s)
        keys = [(name, scheme, options) for name in names for scheme, options in variants(name)]
        calls = [sync_calls(scheme, options, sets[:world], rows, width, unit) for _, scheme, options in keys]
        jobs = [(plat, [Stream(r, "sync", list(c[r]), main=True, comm=True) for r in range(world)]) for c in calls]
        results, got = {}, {}
        for (name, _, _), res, c in zip(keys, engine.run_steps(jobs), calls, strict=True):
            if name not in results or res.step_s < results[name].step_s:  # zen: the faster of its paths
                results[name], got[name] = res, max(counted(c[r], r, world)[1] for r in range(world))
        base_s, base_bytes = results["allreduce"].step_s, got["allreduce"]
        density = sum(len(x) for x in sets[:world]) / world / rows
        for name in names:
            r = results[name]
            out.append({"workload": workload, "paper_name": SETTINGS[workload].paper_name, "source": str(trace),
                        "density": density, "scheme": name, "world_size": world, "bandwidth_gbps": rate / 1e9,
                        "latency_us": 1e6 * latency_s,
                        "unit": unit, "rows": rows, "width": width, "sync_ms": 1e3 * r.step_s,
                        "normalized": r.step_s / base_s, "bytes_received_max": got[name],
                        "bytes_normalized": got[name] / base_bytes, "messages": r.messages})
        print(f"n={world:4d}  " + "  ".join(f"{r['scheme']}={r['normalized']:.3f}"
                                             for r in out if r["world_size"] == world))
    return out
