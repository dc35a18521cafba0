"""The simulator against the emulated cluster: the same cells `zen train --bandwidth` measures, simulated.

For a (workload, world size) cell: this machine's compute timeline (`timeline.measure`), each bucket part's
call recorded once from the real scheme code on the rows each rank's batch looks up at the first measured
step (`record.part_call`: the ranks' tables as the hook gets them), each primitive charged this machine's CPU
per message and byte (`calibrate`); then, at every link rate the cell was measured at, the emulated platform
(the machine's cores shared by all ranks) and each scheme's step on SimGrid. zen's BP-or-HC trial picks, per
embedding part, the path with the faster step (greedy from all BP), as the trial picks by time.

The CPU speed of a launch: every CPU second here was measured on one thread with the machine otherwise idle
(thread CPU time); side by side with the other ranks, the kernel's and other processes' work, a second of it
takes longer. A launch's own no-communication steps (`none`, interleaved with every scheme's steps) measure
that factor: their measured step over their simulated one. It scales every CPU second of the launch (compute,
the hook's recorded work, the messages' CPU); `none` itself then agrees by construction and is left out of
the error statistics.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from simulator import engine, platform
from simulator.calibrate import MessageCost
from simulator.paper import ZEN_PLANS
from simulator.record import counted, part_call, record
from simulator.schedule import Comm, Compute, Item, StepResult
from simulator.step import Calls, ddp_calls, step_streams
from simulator.timeline import Bucket, Part, Timeline
from workloads.base import build_workload
from zen.registry import make_scheme

TORCH_KINDS = ("none", "ddp")


def batch_rows(workload: str, preset: str, world: int, seed: int = 0, step: int = 3) -> list[dict[str, torch.Tensor]]:
    """Per rank, the rows each sparse parameter's gradient has at `step` (from the batch's ids, as
    `zen profile --rows-from ids`; `zen train` draws the same batches)."""
    work = build_workload(workload, preset, seed)
    assert work.rows is not None, f"{workload} gives no rows from batch ids"
    out = []
    for rank in range(world):
        batches = work.batches(rank, world, seed)
        for _ in range(step):
            next(batches)
        out.append(dict(zip(work.sparse_params, work.rows(next(batches)), strict=True)))
    return out


def part_tensors(part: Part, rows: list[dict[str, torch.Tensor]], seed: int) -> list[torch.Tensor]:
    """Each rank's gradient of one part: tables with random values on the rows its batch touched, stacked as
    the bucket lays them out; a dense run is random throughout."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for per_rank in rows:
        if not part.sparse:
            out.append(torch.randn(part.numel, generator=gen))
            continue
        tables = []
        for p in part.params:
            table = torch.zeros(p.shape[0], p.width)
            ids = per_rank[p.name].long()
            table[ids] = torch.randn(len(ids), p.width, generator=gen)
            tables.append(table)
        out.append(torch.cat(tables))
    return out


def record_calls(scheme: str | None, t: Timeline, rows: list[dict[str, torch.Tensor]], seed: int = 0,
                 repeats: int = 1, warmup: int = 1, **options: object) -> Calls:
    """Every bucket part's recorded call for `scheme` (None: the dense path for every part, as `allreduce` and
    a sparse scheme's dense parts take). `warmup` unrecorded calls first (a scheme's per-size state, as after
    the first training steps), then `repeats` recorded ones (local work: their median)."""
    world = len(rows)
    dense_scheme = scheme is None or not make_scheme(scheme, **options).sparse_input
    calls = {}
    for k, bucket in enumerate(t.buckets):
        for i, part in enumerate(bucket.parts()):
            if part.sparse and not dense_scheme:
                instances = [make_scheme(scheme, **options) for _ in range(world)]
                make = part_call(scheme, part_tensors(part, rows, seed + i), world, instances)
            elif not part.sparse and scheme is not None and not dense_scheme:
                continue  # a sparse scheme's dense parts: recorded once, by the caller (scheme None)
            else:
                make = part_call(None, part_tensors(part, rows, seed + i), world)
            calls[k, i] = record(make, world, f"b{k}p{i}", repeats=repeats, warmup=warmup, seed=seed)
    return calls


def with_costs(calls: Calls, cost: MessageCost, world: int) -> Calls:
    """Each primitive priced with what its messages cost the rank's CPU here (gloo's threads, the kernel), per
    message posted and per byte moved (calibrate.MessageCost), spent alongside its transfers; the rounds of a
    collective count as its messages."""
    out = {}
    for key, per_rank in calls.items():
        ranks = []
        for r, items in enumerate(per_rank):
            seq: list[Item] = []
            for item in items:
                if isinstance(item, Comm):
                    sent, received = counted([item], r, world)
                    posts = len(item.sends) + len(item.recvs) if item.kind not in ("all_reduce", "all_gather") \
                        else 2 * (2 * (world - 1) if item.kind == "all_reduce" else max(1, (world - 1).bit_length()))
                    item = replace(item, cpu_s=posts * cost.cpu_per_message_s + (sent + received) * cost.cpu_per_byte_s)
                seq.append(item)
            ranks.append(seq)
        out[key] = ranks
    return out


@dataclass
class Recorded:
    """A cell's schedules, recorded once and simulated at every link rate: per scheme its variants' calls
    (zen: each of its plans), message CPU included; torch's kinds (`none`, `ddp`) need none."""

    t: Timeline
    world: int
    cost: MessageCost
    calls: dict[str, dict[str, Calls]]
    ddp: Calls


def record_cell(t: Timeline, rows: list[dict[str, torch.Tensor]], schemes: list[str], cost: MessageCost,
                seed: int = 0) -> Recorded:
    world = len(rows)
    dense = record_calls(None, t, rows, seed)
    calls: dict[str, dict[str, Calls]] = {}
    for name in schemes:
        if name in TORCH_KINDS:
            continue
        variants = {p: {"choice": p} for p in ZEN_PLANS} if name == "zen" else {"": {}}
        calls[name] = {v: with_costs({**dense, **record_calls(name, t, rows, seed, **opts)}, cost, world)
                       for v, opts in variants.items()}
    return Recorded(t, world, cost, calls, with_costs(ddp_calls(t, world), cost, world))


def scaled(t: Timeline, factor: float) -> Timeline:
    """The timeline with every CPU second taking `factor` seconds."""
    return replace(t, forward_s=factor * t.forward_s, backward_s=factor * t.backward_s,
                   optimizer_s=factor * t.optimizer_s,
                   buckets=[Bucket(factor * b.ready_s, b.params) for b in t.buckets])


def scaled_calls(calls: Calls, factor: float) -> Calls:
    return {key: [[_scaled(i, factor) for i in items] for items in ranks] for key, ranks in calls.items()}


def _scaled(item: Item, factor: float) -> Item:
    if isinstance(item, Compute):
        return Compute(factor * item.seconds)
    return replace(item, cpu_s=factor * item.cpu_s) if isinstance(item, Comm) else item


def launch_factor(rec: Recorded, none_s: float, cores: int = 2) -> float:
    """A launch's CPU factor: its measured no-communication step over the simulated one (module docstring)."""
    plat = platform.emulated(rec.world, 1e9, cores, latency_s=rec.cost.latency_s)
    return none_s / engine.run_step(plat, step_streams("none", rec.world, rec.t)).step_s


def cell_steps(rec: Recorded, link_bps: float, schemes: list[str], cores: int = 2, factor: float = 1.0
                  ) -> dict[str, StepResult]:
    """Each scheme's simulated step on the emulated cluster at `link_bps`, every CPU second x `factor`."""
    plat = platform.emulated(rec.world, link_bps, cores, latency_s=rec.cost.latency_s)
    t = scaled(rec.t, factor)
    results: dict[str, StepResult] = {}
    for name in schemes:
        if name == "ddp":
            results[name] = engine.run_step(plat, step_streams(name, rec.world, t, scaled_calls(rec.ddp, factor)))
        elif name == "none":
            results[name] = engine.run_step(plat, step_streams(name, rec.world, t))
        elif name == "zen":
            results[name] = _zen(plat, t, {v: scaled_calls(c, factor) for v, c in rec.calls[name].items()})
        else:
            results[name] = engine.run_step(plat, step_streams("hook", rec.world, t,
                                                               scaled_calls(rec.calls[name][""], factor)))
    return results


def _zen(plat: platform.Platform, t: Timeline, paths: dict[str, Calls]) -> StepResult:
    """zen's step with its plan chosen per embedding part by the simulated step time: each part's other plans
    tried in turn on top of BP, keeping whichever shortens the step."""
    world = plat.world_size
    chosen = dict(paths["bp"])
    best = engine.run_step(plat, step_streams("hook", world, t, chosen))
    for key, bp in paths["bp"].items():
        for name, calls in paths.items():
            if name == "bp" or calls[key] == bp:
                continue  # a dense part: the same either way
            trial = {**chosen, key: calls[key]}
            result = engine.run_step(plat, step_streams("hook", world, t, trial))
            if result.step_s < best.step_s:
                chosen, best = trial, result
    return best
