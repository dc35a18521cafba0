"""Run schemes on one synthetic input and turn per-rank stats and times into table rows.

Backends: `sim` (virtual ranks in-process; time = max bytes received / modelled bandwidth, since
wall time of P threads on 2 cores means nothing), `gloo` / `nccl` (real ranks spawned by harness.launch,
optionally inside the emulated cluster; time = per-iteration max over ranks, barrier before each).
Every timed call is dense-in, dense-out with extraction included, into a reused output buffer or, with
`in_place`, into the input itself (as DDP's buckets are; the input is refilled before the untimed barrier).
`ranks_per_node` > 1 makes nodes of that many consecutive ranks (one network namespace each in the emulated
cluster) and syncs two-level (zen.twolevel), or flat over all ranks with `flat`. A node's uplink carries
what all its ranks exchange outside the "intra:" phases, so modelled times are per node, not per rank.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any

import torch

from harness.bench.patterns import compressed_gradient, make_gradient
from harness.reference import matches_reference, reference_sum
from zen import costmodel
from zen.api import simulate, sync
from zen.comm.sim import SimComm, SimGroup
from zen.prediction import link_class, uplink_bytes
from zen.registry import make_scheme
from zen.twolevel import dist_node_comms, nodes_of, settling_calls, sim_node_comms
from zen.types import SyncStats

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class BenchConfig:
    backend: str = "sim"
    world_size: int = 4
    schemes: list[str] = field(default_factory=lambda: ["allreduce", "agsparse", "zen"])
    numel: int = 1 << 20
    density: float = 0.01
    pattern: str = "random"
    dtype: str = "fp32"
    repeats: int = 10
    warmup: int = 4  # untimed calls, at least those a scheme spends choosing its path (zen, two-level's auto)
    seed: int = 0
    bandwidth: str | None = None  # emulated link rate (gloo), e.g. "1gbit"
    sim_bandwidth_gbps: float = 25.0  # modelled link rate for sim times
    in_place: bool = False  # out = the input buffer (DDP's case): sparse schemes skip a write of the whole output
    options: dict[str, dict[str, Any]] = field(default_factory=dict)  # scheme -> options
    compress: str | None = None  # inputs: what this compressor of `density` chooses (harness.bench.patterns)
    ranks_per_node: int = 1  # consecutive ranks per node (namespace)
    flat: bool = False  # with ranks_per_node > 1: sync over all ranks at once, not two-level
    intra: str = "auto"  # two-level: the node steps, timed choice, dense (the paper's) or sparse rows

    @property
    def two_level(self) -> bool:
        return self.ranks_per_node > 1 and not self.flat


@dataclass
class RankRecord:
    """What one rank reports for one scheme."""

    stats: SyncStats
    times_s: list[float]
    checksum: float
    correct: bool | None
    alpha_s: float = 0.0  # median latency of a tiny collective on this rank's network
    gloo_loop: str = "-"  # scheduling policy of this rank's gloo event loop (harness.launch.gloo_loop_policy)
    cpu_s: list[float] = field(default_factory=list)  # CPU time per call, all of this rank's threads


def union_density(cfg: BenchConfig) -> float:
    union = torch.zeros(cfg.numel, dtype=torch.bool)
    for g in all_inputs(cfg):
        union |= g != 0
    return int(union.sum()) / cfg.numel


def inputs(cfg: BenchConfig, rank: int) -> torch.Tensor:
    return _gradient(cfg.pattern, cfg.compress, cfg.numel, cfg.density, rank, cfg.world_size, cfg.seed, cfg.dtype)


def all_inputs(cfg: BenchConfig) -> list[torch.Tensor]:
    """Every rank's gradient, generated once per configuration (the data never changes between schemes)."""
    return list(_all_inputs(cfg.pattern, cfg.compress, cfg.numel, cfg.density, cfg.world_size, cfg.seed,
                            cfg.dtype))


@lru_cache(maxsize=1)
def _all_inputs(pattern: str, compress: str | None, numel: int, density: float, world_size: int, seed: int,
                dtype: str) -> tuple[torch.Tensor, ...]:
    return tuple(_gradient(pattern, compress, numel, density, r, world_size, seed, dtype) for r in range(world_size))


def _gradient(pattern: str, compress: str | None, numel: int, density: float, rank: int, world_size: int,
              seed: int, dtype: str) -> torch.Tensor:
    if compress is not None:
        return compressed_gradient(compress, numel, density, rank, seed, DTYPES[dtype])
    return make_gradient(pattern, numel, density, rank, world_size, seed, DTYPES[dtype])


def _reference(cfg: BenchConfig) -> tuple[torch.Tensor, torch.Tensor]:
    return reference_sum(all_inputs(cfg))


def run_sim(cfg: BenchConfig) -> dict[str, list[RankRecord]]:
    grads = all_inputs(cfg)
    total, magnitude = reference_sum(grads)
    outs = [torch.empty_like(g) for g in grads]
    records = {}
    for name in cfg.schemes:
        res = simulate(name, grads, warmup=max(1, cfg.warmup), seed=cfg.seed, outs=outs,
                       ranks_per_node=cfg.ranks_per_node if cfg.two_level else 1, intra=cfg.intra,
                       **cfg.options.get(name, {}))
        ok = all(matches_reference(o, total, magnitude, cfg.world_size) for o in res.outputs)
        same = all(torch.equal(o, res.outputs[0]) for o in res.outputs)
        bw = cfg.sim_bandwidth_gbps * 1e9 / 8
        t = max(uplink_bytes([s.traffic.received for s in res.stats], cfg.ranks_per_node)) / bw
        records[name] = [RankRecord(s, [t], 0.0, ok and same) for s in res.stats]
    return records


def dist_worker(cfg: BenchConfig) -> dict[str, RankRecord]:
    """Body of one real rank (target of harness.launch.spawn)."""
    import torch.distributed as dist

    from zen.comm import scheduling
    from zen.comm.dist import DistComm

    comm = DistComm()
    nodes = None
    if cfg.two_level:
        nodes = dist_node_comms(cfg.ranks_per_node, mode=cfg.intra)
        scheduling.calm_gloo(dist.get_backend())  # the sub-groups' event loops too, as the launcher did the world's
    rank = comm.rank
    grad = inputs(cfg, rank).to(comm.device)
    out = torch.empty_like(grad)
    source = out if cfg.in_place else grad
    reference = _reference(cfg) if rank == 0 else None
    alpha = _tiny_collective_latency(comm)
    gloo_loop = scheduling.gloo_loop_policy()
    records = {}
    for name in cfg.schemes:
        scheme = make_scheme(name, **cfg.options.get(name, {}))
        times, cpu, stats = [], [], SyncStats()
        warmup = max(cfg.warmup, settling_calls(scheme, comm, nodes))  # time only the path it keeps
        for i in range(warmup + cfg.repeats):
            if cfg.in_place:
                out.copy_(grad)
            dist.barrier()
            if comm.device.type == "cuda":
                torch.cuda.synchronize()
            start, cpu_start = time.perf_counter(), time.process_time()
            _, stats = sync(scheme, source, comm, out, nodes=nodes)
            if comm.device.type == "cuda":
                torch.cuda.synchronize()
            if i >= warmup:
                times.append(time.perf_counter() - start)
                cpu.append(time.process_time() - cpu_start)
        correct = None
        if reference is not None:
            correct = matches_reference(out.cpu(), *reference, cfg.world_size)
        checksum = float(out.double().mul(torch.arange(1, out.numel() + 1, device=out.device) % 97).sum())
        records[name] = RankRecord(stats, times, checksum, correct, alpha, gloo_loop, cpu)
    return records


def _tiny_collective_latency(comm: Any, repeats: int = 21) -> float:
    """alpha of the cost model, measured: one 8-byte all-gather, median over repeats."""
    import torch.distributed as dist

    probe = torch.zeros(1, dtype=torch.int64, device=comm.device)
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        comm._all_gather(probe)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def sim_compute_seconds(cfg: BenchConfig, name: str, repeats: int = 3) -> float:
    """Local work of one call with no network at all: the same scheme code on P virtual ranks in
    this process (threads share the cores as the real ranks do), median wall time per call."""
    grads = all_inputs(cfg)
    outs = [torch.empty_like(g) for g in grads]
    group = SimGroup(cfg.world_size, seed=cfg.seed)
    node_comms = sim_node_comms(group, cfg.ranks_per_node, cfg.intra) if cfg.two_level else None
    instances = [make_scheme(name, **cfg.options.get(name, {})) for _ in range(cfg.world_size)]
    times: list[float] = []

    def rank_main(r: int) -> None:
        comm = SimComm(group, r)
        nodes = node_comms(r, comm.device) if node_comms else None
        for i in range(1 + repeats):
            if cfg.in_place:
                outs[r].copy_(grads[r])
            group.barrier.wait()
            start = time.perf_counter()
            sync(instances[r], outs[r] if cfg.in_place else grads[r], comm, outs[r], nodes=nodes)
            group.barrier.wait()
            if r == 0 and i:
                times.append(time.perf_counter() - start)

    group.run(rank_main)
    return statistics.median(times)


def predicted_seconds(cfg: BenchConfig, name: str, recs: list[RankRecord]) -> float:
    """Cost model for a shaped run: simulated local work + alpha-beta time of the exact traffic on the node
    uplinks (a node's ranks share one; its "intra:" phases stay on the node, their copies are local work).
    A flat run on nodes of several ranks counts what two ranks of one node exchange on the uplink too: an
    upper bound."""
    from harness.netem import parse_rate

    net = costmodel.Network(alpha=statistics.median(r.alpha_s for r in recs),
                            bandwidth=parse_rate(cfg.bandwidth) / 8)
    k = cfg.ranks_per_node
    nodes = [recs[n : n + k] for n in range(0, len(recs), k)]
    phases = sorted({p for r in recs for p in r.stats.traffic.calls if link_class(p) != "intra"})
    sent = {p: [sum(r.stats.traffic.sent.get(p, 0) for r in node) for node in nodes] for p in phases}
    received = {p: [sum(r.stats.traffic.received.get(p, 0) for r in node) for node in nodes] for p in phases}
    calls = {p: max(r.stats.traffic.calls.get(p, 0) for r in recs) for p in phases}
    return sim_compute_seconds(cfg, name) + costmodel.traffic_time(sent, received, calls, net)


def run_dist(cfg: BenchConfig) -> dict[str, list[RankRecord]]:
    from harness.launch import spawn

    backend = "nccl" if cfg.backend == "nccl" else "gloo"
    target, kwargs = "harness.bench.harness:dist_worker", {"cfg": cfg}
    if cfg.bandwidth:
        from harness.netem import emulated_cluster

        with emulated_cluster(cfg.world_size, cfg.bandwidth, ranks_per_node=cfg.ranks_per_node) as cluster:
            per_rank = spawn(target, cfg.world_size, kwargs, backend=backend, **cluster.spawn_kwargs())
    else:
        per_rank = spawn(target, cfg.world_size, kwargs, backend=backend)
    return {name: [per_rank[r][name] for r in range(cfg.world_size)] for name in cfg.schemes}


def imbalance(stats: list[SyncStats]) -> tuple[float | None, float | None]:
    """Push: max over workers i, servers j of n |I_i^j| / |I_i|. Pull: max_j n |I^j| / |I| (zen.md).
    Counted in each scheme's own units (rows; blocks for OmniReduce)."""
    n = len(stats)
    push = pull = None
    if all(s.push_counts is not None for s in stats):
        ratios = [n * c / sum(s.push_counts) for s in stats if sum(s.push_counts) for c in s.push_counts]
        push = max(ratios) if ratios else 1.0
    if all(s.server_count is not None for s in stats):
        total = sum(s.server_count for s in stats)
        pull = n * max(s.server_count for s in stats) / total if total else 1.0
    return push, pull


def rows(cfg: BenchConfig, records: dict[str, list[RankRecord]]) -> list[dict[str, Any]]:
    """One nccl-tests style row per scheme; speedups are ratios measured in this same run."""
    udens = union_density(cfg)
    itemsize = DTYPES[cfg.dtype].itemsize
    out = []
    for name, recs in records.items():
        per_iter = [max(r.times_s[i] for r in recs) for i in range(len(recs[0].times_s))]
        recv = [r.stats.traffic.bytes_received for r in recs]
        push, pull = imbalance([r.stats for r in recs])
        median = statistics.median(per_iter)
        same = len({r.checksum for r in recs}) == 1
        correct = all(r.correct for r in recs if r.correct is not None) and same
        phases = sorted({p for r in recs for p in r.stats.traffic.received})
        out.append({
            "scheme": name, "backend": cfg.backend, "world_size": cfg.world_size, "numel": cfg.numel,
            "density": cfg.density, "pattern": cfg.pattern if cfg.compress is None else f"{cfg.compress}-chosen",
            "dtype": cfg.dtype, "bandwidth": cfg.bandwidth,
            "in_place": cfg.in_place, "gloo_loop": recs[0].gloo_loop, "ranks_per_node": cfg.ranks_per_node,
            "sync": _sync_kind(cfg, recs), "intra": cfg.intra if cfg.two_level else None,
            "uplink_received_max": max(uplink_bytes([r.stats.traffic.received for r in recs], cfg.ranks_per_node)),
            "union_density": udens, "nnz_max": max(r.stats.nnz for r in recs),
            "bytes_sent_max": max(r.stats.traffic.bytes_sent for r in recs),
            "bytes_received_max": max(recv), "bytes_received_mean": statistics.fmean(recv),
            "phases_received_max": {p: max(r.stats.traffic.received.get(p, 0) for r in recs) for p in phases},
            "push_imbalance": push, "pull_imbalance": pull,
            "cpu_ms_median": _cpu_ms_median(recs),
            "time_ms_median": 1e3 * median, "time_ms_p99": 1e3 * _percentile(per_iter, 0.99),
            "time_source": "bytes/bandwidth" if cfg.backend == "sim" else "measured",
            "algbw_GBps": cfg.numel * itemsize / median / 1e9 if median else None,
            "time_ms_predicted": 1e3 * predicted_seconds(cfg, name, recs) if cfg.bandwidth else None,
            "choice": recs[0].stats.choice, "correct": correct, "times_ms": [1e3 * t for t in per_iter],
            "config": {k: v for k, v in asdict(cfg).items() if k != "schemes"},
        })
    base = next((r for r in out if r["scheme"] == "allreduce"), None)
    for r in out:
        r["speedup_vs_allreduce"] = base["time_ms_median"] / r["time_ms_median"] if base else None
    return out


def _sync_kind(cfg: BenchConfig, recs: list[RankRecord]) -> str:
    """flat, or two-level with the node steps its timed calls ran (`intra="auto"`: the ones it chose, flat
    where it found no node steps faster)."""
    if not cfg.two_level:
        return "flat"
    ran = recs[0].stats.intra or cfg.intra
    return {"dense": "two-level", "sparse": "two-level-sparse"}.get(ran, ran)


def _cpu_ms_median(recs: list[RankRecord]) -> float | None:
    """Median over calls of the ranks' mean CPU time per call (None where not measured: the simulator)."""
    if not recs[0].cpu_s:
        return None
    return 1e3 * statistics.median([statistics.fmean(c) for c in zip(*(r.cpu_s for r in recs), strict=True)])


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def run_bench(cfg: BenchConfig) -> list[dict[str, Any]]:
    if cfg.backend not in ("sim", "gloo", "nccl"):
        raise ValueError(f"unknown backend {cfg.backend!r}; choose sim, gloo or nccl")
    if cfg.in_place and cfg.backend == "sim":
        raise ValueError("in_place needs a real backend: sim times are bytes / bandwidth, the same either way")
    nodes_of(cfg.world_size, cfg.ranks_per_node)
    if cfg.flat and cfg.backend == "sim":
        raise ValueError("flat on nodes needs a real backend: the sim backend has no node layout to keep")
    nnz = round(cfg.numel * cfg.density)
    if cfg.world_size < 1 or cfg.numel < 1 or not 0 <= cfg.density <= 1 or nnz > cfg.numel:
        raise ValueError("need world_size >= 1, numel >= 1 and density in [0, 1]")
    make = run_sim if cfg.backend == "sim" else run_dist
    return rows(cfg, make(cfg))
