"""The paper's cluster simulated (section 6: 16 machines x 8 V100, 25 Gbps TCP or 100 Gbps), and larger ones,
from a trace at the paper's density (`zen profile --preset table1 --rows-from ids`).

The model of a workload at the paper's scale (`SETTINGS`): Table 1's embedding parameters are the sparse part,
laid out as the trace's rows (the rows its workers' batches touch) times the width that gives Table 1's
parameter count; the dense part is the rest of the paper's model (stated per workload). Each GPU is a rank;
the embedding bucket syncs two-level as the paper does (section 5 step 2, zen.twolevel): a dense reduce-scatter
of contiguous row shards over NVLink, the scheme across machines on each shard of the machine's sum (the real
scheme recorded through the recording communicator, one group of machines per shard), an all-gather over
NVLink. The dense part goes by a ring all-reduce over all GPUs, as NCCL's. The compute timeline is a stated
roofline (`V100`), local work of a sparse call one pass over its shard at the paper's hashing rate.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from simulator import engine, omnistream, platform, sparcmerge
from simulator.omnistream import BlockCost
from simulator.record import record_once
from simulator.schedule import COLLECTIVES, Comm, Compute, Item, StepResult
from simulator.sparcmerge import MergeCost
from simulator.step import Calls, step_streams
from simulator.timeline import Bucket, Param, Timeline
from simulator.widths import extrapolate, plan
from zen.api import sync
from zen.registry import make_scheme
from zen.twolevel import shard_bounds

V100_FLOPS = 15.7e12  # fp32 peak of a Tesla V100 SXM2 (NVIDIA's V100 datasheet)
V100_UTILIZATION = 0.4  # stated assumption: 40% of peak in training
V100_HASH_RATE = 214e6 / 6e-3  # elements per second: the paper's hashing of 214M elements in ~6 ms (Fig 16)
NVLINK_BPS = 1200e9  # ~150 GB/s between two V100s of a DGX-1 machine


@dataclass(frozen=True)
class Setting:
    """A workload at the paper's scale: Table 1's embedding parameters, the rest of the model (dense), tokens a
    GPU trains on per step (6 x dense parameters FLOPs per token: forward and backward)."""

    paper_name: str
    embedding_params: float
    dense_params: float
    tokens: int
    batch: int
    dense_source: str


SETTINGS = {
    "lstm": Setting("LSTM", 406e6, 9.45e6, 128 * 20, 128, "the LSTMP layer (2048 -> 512) of the 1B-word LSTM"),
    "dlrm": Setting("DeepFM", 214e6, 0.48e6, 1024, 1024, "DLRM's reference MLPs for Criteo"),
    "gpt2": Setting("NMT", 112e6, 31.5e6, 64 * 40, 64, "a transformer_iwslt_de_en body (6+6 layers, 512, FFN 1024)"),
    "bert": Setting("BERT", 30522 * 768, 86e6, 5 * 128, 5, "BERT-base's encoder"),
}


def paper_width(s: Setting, rows: int) -> int:
    """The row width that lays Table 1's embedding parameters out on the trace's rows, to a multiple of 8
    (within 0.4% of Table 1 for every workload; OmniReduce's 256-element blocks then record at an eighth of the
    width, simulator.widths)."""
    return max(8, 8 * round(s.embedding_params / rows / 8))


def roofline(s: Setting, scale: float = 1.0) -> Timeline:
    """V100 step: 6 x dense parameters x tokens FLOPs at V100_UTILIZATION of the peak, a third forward; the
    dense gradients ready half way through backward, the embedding's at its end (the first layer). `scale`
    multiplies the compute: how the step ratios move when the utilization is not the stated one."""
    compute = scale * 6 * s.dense_params * s.tokens / (V100_FLOPS * V100_UTILIZATION)
    rows = 1  # placeholders: parts() only needs which parameters are sparse
    return Timeline(compute / 3, 2 * compute / 3, 0.0,
                    [Bucket(compute / 3, (Param("dense", (int(s.dense_params),), False),)),
                     Bucket(2 * compute / 3, (Param("embedding", (rows, 1), True),))],
                    source=f"roofline: 6 x {s.dense_params:.3g} dense parameters x {s.tokens} tokens at "
                           f"{V100_UTILIZATION:.0%} of a V100's {V100_FLOPS / 1e12:g} TFLOP/s")


def load_sets(trace: Path) -> tuple[int, list[torch.Tensor]]:
    """A `zen profile` traces.pt as one row set per worker (parameters stacked, the last step)."""
    from harness.bench.scale import replay_sets

    data = replay_sets(torch.load(trace, weights_only=True))
    return int(data["rows"]), [s.long() for s in data["sets"]]


def node_shards(sets: list[torch.Tensor], nodes: int, gpus: int, rows: int) -> list[list[torch.Tensor]]:
    """[node][shard]: the rows of the machine's summed gradient in each contiguous shard (ids within it)."""
    bounds = shard_bounds(rows, gpus)
    out = []
    for m in range(nodes):
        union = torch.unique(torch.cat(sets[m * gpus:(m + 1) * gpus]))
        out.append([union[(union >= bounds[j]) & (union < bounds[j + 1])] - bounds[j] for j in range(gpus)])
    return out


def shard_sizes(rows: int, gpus: int) -> list[int]:
    """Rows of each contiguous shard of a table of `rows` (zen.twolevel's split)."""
    bounds = shard_bounds(rows, gpus)
    return [b - a for a, b in zip(bounds, bounds[1:], strict=False)]


def record_cross(scheme: str, shards: list[list[torch.Tensor]], sizes: list[int], width: int, seed: int = 0,
                 **options: object) -> list[list[list[Item]]]:
    """[shard][node]: the messages of the scheme across machines on each shard (`sizes[j]` rows) of the
    machines' sums, from the real code on COO inputs with a COO result (memory for the rows only): from two
    narrower recordings where that is exact (simulator.widths.plan), else at `width` itself. Local work is left
    out (the caller charges the GPU's hashing rate)."""
    how = plan(scheme, width, dict(options))
    if how is not None:
        narrow, wider = (_record_cross(scheme, shards, sizes, w, seed, opts)
                         for w, opts in zip(how.widths, how.options, strict=True))
        return [extrapolate(a, b, how.target) for a, b in zip(narrow, wider, strict=True)]
    exact = _record_cross(scheme, shards, sizes, width, seed, dict(options))
    return [[[i for i in items if isinstance(i, Comm)] for items in shard] for shard in exact]


def shard_options(options: dict[str, object], j: int) -> dict[str, object]:
    """A scheme's options on shard `j`: zen's `choices` (a plan per shard, `zen_options`) as that shard's `choice`."""
    if "choices" not in options:
        return options
    rest = {k: v for k, v in options.items() if k != "choices"}
    return {**rest, "choice": options["choices"][j]}  # type: ignore[index]


def _record_cross(scheme: str, shards: list[list[torch.Tensor]], sizes: list[int], width: int, seed: int,
                  options: dict[str, object]) -> list[list[list[Item]]]:
    nodes, gpus = len(shards), len(shards[0])
    out = []
    for j in range(gpus):
        gen = torch.Generator().manual_seed(seed + j)
        tensors = [torch.sparse_coo_tensor(ids.unsqueeze(0), torch.randn(len(ids), width, generator=gen),
                                           (sizes[j], width), check_invariants=False).coalesce()
                   for ids in (shards[m][j] for m in range(nodes))]
        instances = [make_scheme(scheme, **shard_options(options, j)) for _ in range(nodes)]

        def fn(comm: object, rank: int, tensors: list[torch.Tensor] = tensors, instances: list = instances) -> None:
            sync(instances[rank], tensors[rank], comm, validate=False, sparse_result=True,  # type: ignore[arg-type]
                 sizes_agreed=True)  # a DDP step's: its buckets' sizes are agreed

        out.append(record_once(fn, nodes, f"x{j}", seed)[0])
    return out


def embedding_calls(cross: list[list[list[Item]]] | None, nodes: int, gpus: int, rows: int, width: int
                    ) -> list[list[Item]]:
    """Per GPU, the embedding bucket's sync as zen.twolevel runs it: a dense reduce-scatter of contiguous row
    shards in the machine, one pass over its shard at the paper's hashing rate, the scheme across machines
    (`cross`, from `record_cross`; None: one machine), an all-gather in the machine."""
    bounds = shard_bounds(rows, gpus)
    shard_bytes = [4 * width * (bounds[j + 1] - bounds[j]) for j in range(gpus)]
    out = []
    for g in range(nodes * gpus):
        m, j = divmod(g, gpus)
        peers = [m * gpus + i for i in range(gpus) if i != j]
        items: list[Item] = []
        if gpus > 1:
            items.append(Comm("all_to_all", "rs", {p: shard_bytes[j] for p in peers},
                              {p: shard_bytes[j] for p in peers}))
        items.append(Compute(shard_bytes[j] / 4 / V100_HASH_RATE))
        if cross is not None:
            items += [_global(i, j, gpus, nodes) if isinstance(i, Comm) else i for i in cross[j][m]]
        if gpus > 1:
            items.append(Comm("all_to_all", "ag", {p: shard_bytes[j] for p in peers},
                              {p: shard_bytes[p % gpus] for p in peers}))
        out.append(items)
    return out


def machine_calls(cross: list[list[list[Item]]], nodes: int, gpus: int, rows: int, width: int) -> list[list[Item]]:
    """`embedding_calls` with each machine as one endpoint (`per="machine"`): its GPUs' cross-machine messages
    merged, the k-th primitive of every shard group into one carrying their summed bytes (one flow per machine
    pair and phase instead of `gpus`), the reduce-scatter and all-gather inside the machine by their NVLink
    closed form. ValueError where the shard groups' schedules differ in shape (then they cannot merge)."""
    sizes = shard_sizes(rows, gpus)
    inside = nvlink_s(4 * width * max(sizes) * (gpus - 1), gpus - 1) if gpus > 1 else 0.0
    out = []
    for m in range(nodes):
        groups = [[i for i in cross[j][m] if isinstance(i, Comm)] for j in range(gpus)]
        if len({tuple((i.kind, i.itemsize, i.group) for i in g) for g in groups}) != 1:
            raise ValueError(f"machine {m}: its shard groups' primitives differ; simulate per GPU")
        merged = [Comm(ops[0].kind, ops[0].call, _summed(o.sends for o in ops), _summed(o.recvs for o in ops),
                       sum(o.nbytes for o in ops), ops[0].itemsize, ops[0].group, sum(o.cpu_s for o in ops))
                  for ops in zip(*groups, strict=True)]
        out.append([Compute(inside), Compute(width * max(sizes) / V100_HASH_RATE), *merged, Compute(inside)])
    return out


def machine_all_reduce(call: str, nbytes: int, gpus: int) -> list[Item]:
    """NCCL's two-level all-reduce of a machine as one endpoint: the ring inside by its NVLink closed form, one
    ring across machines carrying the machine's whole tensor (its GPUs' rings, each a 1/gpus share, summed)."""
    inside = nvlink_s(nbytes * (gpus - 1) / gpus, gpus - 1)
    return [Compute(inside), Comm("all_reduce", call, nbytes=nbytes), Compute(inside)]


def _summed(maps: Iterable[dict[int, int]]) -> dict[int, int]:
    out: dict[int, int] = {}
    for peers in maps:
        for p, b in peers.items():
            out[p] = out.get(p, 0) + b
    return out


def nvlink_s(nbytes: float, steps: int, intra_latency_s: float = 2e-6) -> float:
    """A GPU's `nbytes` over its NVLink inside the machine in `steps` messages (platform.gpu_cluster's link)."""
    return 8 * nbytes / NVLINK_BPS + steps * intra_latency_s


def _global(item: Comm, j: int, gpus: int, nodes: int) -> Comm:
    """A cross-machine primitive of shard group j: machine m's rank becomes GPU m * gpus + j (a collective
    runs among the group's GPUs)."""
    group = tuple(m * gpus + j for m in range(nodes)) if item.kind in COLLECTIVES else None
    return Comm(item.kind, item.call, {m * gpus + j: b for m, b in item.sends.items()},
                {m * gpus + j: b for m, b in item.recvs.items()}, item.nbytes, item.itemsize, group, item.cpu_s)


ZEN_PLANS = ("bp", "bp-range", "hc", "ag", "allreduce")  # zen's plans, with the ids it takes where nothing is timed
# at the paper's scale the all-gather is left out: what a rank receives grows with the machines (AGsparse, its COO
# twin, takes 2.6-12x zen's step at 128-1,024 GPUs), and recording it at 1,024 GPUs holds every machine's rows on
# every rank
ZEN_PATHS = {"zen": ZEN_PLANS[:3], "zen-bp": ("bp",), "zen-hc": ("hc",), "zen-bp-range": ("bp-range",)}
# the baselines as the paper ran them: its SparCML is SSAR_Recursive_double (section 6's baselines, and its design
# space's row for SparCML); "sparcml-auto" is this library's own pick among SparCML's variants (choose_variant),
# which at these densities takes the split variants the paper did not compare against
BASELINE_PATHS: dict[str, tuple[str, dict[str, object]]] = {
    "sparcml": ("sparcml", {"variant": "ssar_recursive_double"}), "sparcml-auto": ("sparcml", {}),
    "zen-bp-coo": ("zen", {"choice": "bp", "pull": "coo"})}  # Fig 17b's breakdown: BP pulling COO, not its bitmap


def variants(name: str) -> list[tuple[str, dict[str, object]]]:
    """The recorded variants of a scheme: zen's plans as zen runs them with `choice` fixed (every plan its
    selector weighs for `zen`, BP over hashes or ranges, HC or its all-gather, with the ids it prefers where nothing
    is timed; one for zen-bp and zen-hc, so BP and HC can be told apart), a baseline as the paper ran it
    (`BASELINE_PATHS`), else the scheme."""
    if name in ZEN_PATHS:
        return [("zen", {"choice": c}) for c in ZEN_PATHS[name]]
    return [BASELINE_PATHS.get(name, (name, {}))]


def scheme_steps(workload: str, sets: list[torch.Tensor], rows: int, nodes: int, gpus: int, rates: list[float],
             schemes: list[str], latency_s: float = 10e-6, jobs: int = 1, per: str = "gpu", compute_scale: float = 1.0,
             block_cost: BlockCost | None = None, notes: dict[str, dict[str, float]] | None = None,
             merge_cost: MergeCost | None = None, picked: dict[float, tuple[str, ...]] | None = None
             ) -> dict[float, dict[str, StepResult]]:
    """Each scheme's step on `nodes` x `gpus` GPUs (ranks machine by machine) at every NIC rate in `rates`,
    "none" computing only. Schedules are recorded once and replayed at every rate; zen is the plan its own
    prediction picks at each rate (`zen_picks`, written into `picked`), zen-bp and the like one plan each
    (`ZEN_PATHS`). `jobs`: simulations run at once. `per`: "gpu", every GPU a rank with its own flows; "machine",
    every machine one endpoint (`machine_calls`: 1/gpus of the flows, so 1,024 GPUs fit SimGrid's sharing solver
    here; tests hold it against "gpu"). `block_cost`: OmniReduce's aggregator work per block, priced
    (`_sparse_calls`, which notes its size in `notes`); `merge_cost`: SparCML's merge per round, likewise."""
    s = SETTINGS[workload]
    width = paper_width(s, rows)
    t = roofline(s, compute_scale)
    world = nodes * gpus
    if len(sets) < world:
        raise ValueError(f"the trace has {len(sets)} workers, fewer than {world} GPUs")
    if per not in ("gpu", "machine"):
        raise ValueError(f"per must be 'gpu' or 'machine', got {per!r}")
    shards = node_shards(sets[:world], nodes, gpus, rows) if nodes > 1 else None
    by_machine = per == "machine" and shards is not None
    ranks = nodes if by_machine else world
    dense_bytes = 4 * int(s.dense_params)
    if by_machine:
        dense = [machine_all_reduce("dense", dense_bytes, gpus) for _ in range(ranks)]
    else:
        dense = [[Comm("all_reduce", "dense", nbytes=dense_bytes)] for _ in range(world)]
    calls_of: dict[tuple, Calls | None] = {("none",): None}  # one recording and simulation per variant
    paths: dict[str, list[tuple]] = {"none": [("none",)]}
    picks = zen_picks(shards, shard_sizes(rows, gpus), width, rates, latency_s) if "zen" in schemes else {}
    if picked is not None:
        picked.update(picks)
    for name in schemes:
        chosen = [("zen", zen_options(c)) for c in dict.fromkeys(picks.values())] if name == "zen" else None
        for scheme, options in chosen or variants(name):
            key = (scheme, *sorted(options.items()))
            paths.setdefault(name, []).append(key)
            if key in calls_of:  # zen's paths again for zen-bp or zen-hc
                continue
            if make_scheme(scheme, **shard_options(options, 0)).sparse_input:
                emb = _sparse_calls(scheme, options, shards, (nodes, gpus, rows, width), by_machine, latency_s,
                                    block_cost, notes, merge_cost)
            elif by_machine:
                emb = [machine_all_reduce("emb", 4 * rows * width, gpus) for _ in range(ranks)]
            else:
                emb = [[Comm("all_reduce", "emb", nbytes=4 * rows * width)] for _ in range(world)]
            calls_of[key] = {(0, 0): dense, (1, 0): emb}
    streams = [step_streams("none", ranks, t) if calls is None else step_streams("hook", ranks, t, calls, lanes=1)
               for calls in calls_of.values()]
    out: dict[float, dict[str, StepResult]] = {}
    for rate in rates:
        plat = platform.machines(nodes, rate, latency_s, cores=2 * gpus + 2) if by_machine else \
            platform.gpu_cluster(nodes, gpus, rate, NVLINK_BPS, latency_s)
        results = dict(zip(calls_of, engine.run_steps([(plat, st) for st in streams], jobs), strict=True))
        best = {name: min((results[k] for k in keys), key=lambda r: r.step_s) for name, keys in paths.items()}
        if picks:
            best["zen"] = results[("zen", *zen_options(picks[rate]).items())]
        out[rate] = best
    return out


def zen_picks(shards: list[list[torch.Tensor]] | None, sizes: list[int], width: int, rates: list[float],
              latency_s: float) -> dict[float, tuple[str, ...]]:
    """The plan zen picks at each NIC rate by the library's own prediction (zen.algorithms.plans), from the counts
    its ranks all-gather after BP, in every shard group (one per entry of `sizes`). A machine's shard groups share
    its NIC, so they are predicted together (their bytes add up per machine) and take one plan; where that is BP, each
    group the partitioning of the mix that is fastest together (`plans.choose_side_by_side`). Bytes and latency
    only: the simulated step charges every plan the same local work (the GPU's pass over its shard). One machine:
    BP (nothing to pick)."""
    if shards is None:
        return {rate: ("bp",) * len(sizes) for rate in rates}
    from zen.algorithms import plans
    from zen.costmodel import Network
    from zen.types import WireLayout

    zen = make_scheme("zen")
    nodes = len(shards)
    groups = [plans.counts_of([shards[m][j] for m in range(nodes)], WireLayout(nodes, size, width, 4, 4), 0, zen.bp)
              for j, size in enumerate(sizes)]
    runs = {name: zen.plan(name) for name in plans.PLANS}
    return {rate: tuple(plans.choose_side_by_side(groups, Network(latency_s, rate / 8), runs)) for rate in rates}


def zen_options(picked: tuple[str, ...]) -> dict[str, object]:
    """zen's recorded options for the plans its shard groups picked: one `choice` where they agree (the recording
    zen-bp and the like share), else `choices`, a plan per shard (`_record_cross`)."""
    return {"choice": picked[0]} if len(set(picked)) == 1 else {"choices": picked}


def plan_label(picked: tuple[str, ...]) -> str:
    """The zen_plan column: the plan, or where shard groups differ, the commonest and the shards that differ."""
    common = max(dict.fromkeys(picked), key=picked.count)
    apart = {p: [j for j, q in enumerate(picked) if q == p] for p in dict.fromkeys(picked) if p != common}
    return common + "".join(f" ({p}: shards {', '.join(map(str, js))})" for p, js in apart.items())


def _sparse_calls(scheme: str, options: dict[str, object], shards: list[list[torch.Tensor]] | None,
                  size: tuple[int, int, int, int], by_machine: bool, latency_s: float, block_cost: BlockCost | None,
                  notes: dict[str, dict[str, float]] | None, merge_cost: MergeCost | None = None
                  ) -> list[list[Item]]:
    """A sparse scheme's embedding calls (`size`: nodes, GPUs a machine, rows, width). OmniReduce's, when
    `block_cost` is given, with its aggregators' work per pushed block (simulator.omnistream.priced); `notes`
    gets, under the scheme's name, the busiest aggregator's work and its columns' round-trip floor (seconds), and
    the most blocks a GPU sends and receives (each one of OmniReduce's messages). SparCML's as the paper ran it
    (SSAR_Recursive_double), when `merge_cost` is given, with each round's merge after it (simulator.sparcmerge;
    per GPU only), its busiest GPU's merges noted."""
    nodes, gpus, rows, width = size
    cross = record_cross(scheme, shards, shard_sizes(rows, gpus), width, **options) if shards is not None else None
    if cross is not None and merge_cost is not None and options.get("variant") == "ssar_recursive_double":
        if by_machine:
            raise ValueError("SparCML's merges are priced per GPU (per='gpu'): a machine endpoint has no GPU's own")
        cross = [[sparcmerge.priced(items, merge_cost, width) for items in shard] for shard in cross]
        if notes is not None:
            notes[scheme] = {"merge_work_s": max(sum(i.seconds for i in items if isinstance(i, Compute))
                                                 for shard in cross for items in shard)}
    if cross is not None and scheme == "omnireduce" and block_cost is not None:
        cross = [[omnistream.priced(items, block_cost) for items in shard] for shard in cross]
        if notes is not None:
            ranks = [items for shard in cross for items in shard]
            notes[scheme] = {"aggregator_work_s": max(sum(i.cpu_s for i in items if isinstance(i, Comm))
                                                      for items in ranks),
                             "round_trip_floor_s": max(omnistream.round_trip_floor(items, latency_s)
                                                       for items in ranks),
                             "block_messages": max(omnistream.block_messages(items) for items in ranks)}
    return machine_calls(cross, nodes, gpus, rows, width) if by_machine else \
        embedding_calls(cross, nodes, gpus, rows, width)


def model_comm(workload: str, profile: tuple[list[dict], list[list[torch.Tensor]], int], scheme: str, nodes: int,
               gpus: int, rates: list[float], rows: int) -> dict[float, float]:
    """The closed-form cluster model (harness.bench.cluster, `zen cluster`) on the same trace (`load_profile`'s
    triple, loaded once) and sizes, seconds per NIC rate: the simulator's analytical check (no overlap with
    backward, no contention between the GPUs' shards). Its bytes are predicted once (at 1,024 GPUs that is
    minutes) and priced at every rate."""
    from harness.bench.cluster import Cluster, step_time

    s = SETTINGS[workload]
    width = paper_width(s, rows)
    params, sets, _ = profile
    params = [{**p, "width": width} for p in params]
    t = step_time(scheme, params, sets, int(s.dense_params), Cluster(nodes, gpus, rates[0], NVLINK_BPS, V100_HASH_RATE))
    return {r: t["comm_s"] - t["uplink_s"] + 8 * t["uplink_bytes"] / r for r in rates}


def _block_fields(note: dict[str, float] | None, cost: BlockCost | None) -> dict[str, float]:
    """OmniReduce's streaming costs in a row (NaN for the other schemes): the aggregator's work per block, the
    busiest aggregator's work in the step, its columns' round-trip floor, the most block messages a GPU moves."""
    nan = float("nan")
    if note is None or cost is None or "aggregator_work_s" not in note:
        return {"block_cost_ns": nan, "aggregator_work_ms": nan, "round_trip_floor_ms": nan, "block_messages": nan}
    return {"block_cost_ns": 1e9 * cost.aggregate_s, "aggregator_work_ms": 1e3 * note["aggregator_work_s"],
            "round_trip_floor_ms": 1e3 * note["round_trip_floor_s"], "block_messages": note["block_messages"]}


def _merge_fields(note: dict[str, float] | None, cost: MergeCost | None, width: int) -> dict[str, float]:
    """SparCML's merges in a row (NaN for the other schemes): a merged row's cost at the row width, the busiest
    GPU's merges in the step."""
    if note is None or cost is None or "merge_work_s" not in note:
        return {"merge_ns_per_row": float("nan"), "merge_work_ms": float("nan")}
    return {"merge_ns_per_row": 1e9 * cost.seconds(1, width), "merge_work_ms": 1e3 * note["merge_work_s"]}


def step_fields(res: dict[str, StepResult]) -> dict[str, dict[str, float]]:
    """Per scheme (not "none"): its step, the compute-only step, its exposed communication, Zen's speedups over it
    (the step's, and the exposed communication's), its messages."""
    base, zen = res["none"].step_s, res["zen"].step_s
    return {name: {"step_ms": 1e3 * r.step_s, "compute_ms": 1e3 * base, "exposed_comm_ms": 1e3 * (r.step_s - base),
                   "zen_speedup": r.step_s / zen,
                   "zen_comm_speedup": (r.step_s - base) / (zen - base) if zen > base else float("nan"),
                   "messages": r.messages} for name, r in res.items() if name != "none"}


def table(workload: str, profile: Path, node_counts: list[int], gpus: int, rates: list[float], schemes: list[str],
          jobs: int = 1, per: str = "gpu", compute_scales: tuple[float, ...] = (1.0,),
          block_cost: BlockCost | None = None, merge_cost: MergeCost | None = None) -> list[dict[str, object]]:
    """CSV rows: every scheme's simulated step at every machine count, NIC rate and compute scale (of the
    roofline's), with Zen's speedups over it (throughput, and exposed communication) and the analytical model's
    communication time beside (for the schemes it knows by name: not a baseline's paper variant, BASELINE_PATHS);
    OmniReduce's per-block costs priced with `block_cost`, and its columns' round-trip floor; SparCML's merges
    with `merge_cost`; zen's row names the plan its prediction picked."""
    from harness.bench.cluster import load_profile

    rows, sets = load_sets(profile / "traces.pt")
    model = load_profile(profile)
    s = SETTINGS[workload]
    out: list[dict[str, object]] = []
    for nodes, scale in [(n, c) for n in node_counts for c in compute_scales]:
        notes: dict[str, dict[str, float]] = {}
        picked: dict[float, tuple[str, ...]] = {}
        results = scheme_steps(workload, sets, rows, nodes, gpus, rates, schemes, jobs=jobs, per=per,
                               compute_scale=scale, block_cost=block_cost, notes=notes, merge_cost=merge_cost,
                               picked=picked)
        models = {name: model_comm(workload, model, name, nodes, gpus, rates, rows) for name in schemes
                  if name not in BASELINE_PATHS}
        for rate, res in results.items():
            for name, fields in step_fields(res).items():
                r = res[name]
                out.append({"workload": workload, "paper_name": s.paper_name, "scheme": name, "nodes": nodes,
                            "gpus_per_node": gpus, "world_size": nodes * gpus, "bandwidth_gbps": rate / 1e9,
                            **fields, "comm_busy_ms": 1e3 * max(r.comm_busy_s),
                            "samples_per_s": nodes * gpus * s.batch / r.step_s,
                            "model_comm_ms": 1e3 * models[name][rate] if name in models else float("nan"),
                            "timeline": roofline(s).source, "compute_scale": scale, "width": paper_width(s, rows),
                            "rows": rows, "per": per, "zen_plan": plan_label(picked[rate]) if name == "zen" else None,
                            **_block_fields(notes.get(name), block_cost),
                            **_merge_fields(notes.get(name), merge_cost, paper_width(s, rows))})
    return out
