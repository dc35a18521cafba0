"""The simulator against the emulated cluster: the same cells `zen train --bandwidth` measures, simulated.

For a (workload, world size) cell: this machine's compute timeline (`timeline.measure`), each bucket part's
call recorded from the real scheme code on the rows each rank's batch looks up at the measured step
(`record.part_call`: the ranks' tables as the hook gets them), the emulated platform at the link rate with
the machine's cores shared by all ranks; then each scheme's step on SimGrid. zen's BP-or-HC trial picks,
per embedding part, the path with the faster step (greedy from all BP), as the trial picks by time.
"""

from __future__ import annotations

import torch

from simulator import engine, platform
from simulator.calibrate import MessageCost
from simulator.record import counted, part_call, record
from simulator.schedule import Comm, Compute, Item, StepResult
from simulator.step import Calls, step_streams
from simulator.timeline import Part, Timeline
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
                 repeats: int = 3, **options: object) -> Calls:
    """Every bucket part's recorded call for `scheme` (None: the dense path for every part, as `allreduce` and
    a sparse scheme's dense parts take)."""
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
            calls[k, i] = record(make, world, f"b{k}p{i}", repeats=repeats, seed=seed)
    return calls


def with_costs(calls: Calls, cost: MessageCost, world: int) -> Calls:
    """Each primitive preceded by what its messages cost the rank's CPU here (gloo, the kernel): per message
    posted and per byte moved (calibrate.MessageCost); the rounds of a collective count as its messages."""
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
                    seq.append(Compute(posts * cost.cpu_per_message_s + (sent + received) * cost.cpu_per_byte_s))
                seq.append(item)
            ranks.append(seq)
        out[key] = ranks
    return out


def simulate_cell(t: Timeline, rows: list[dict[str, torch.Tensor]], link_bps: float, schemes: list[str],
                  cost: MessageCost, cores: int = 2, seed: int = 0) -> dict[str, StepResult]:
    """Each scheme's simulated step on the emulated cluster (`none` and `ddp` included when listed)."""
    world = len(rows)
    plat = platform.emulated(world, link_bps, cores, latency_s=cost.latency_s)
    dense = record_calls(None, t, rows, seed)
    results: dict[str, StepResult] = {}
    for name in schemes:
        if name in TORCH_KINDS:
            results[name] = engine.simulate(plat, step_streams(name, world, t))
        elif name == "zen":
            paths = {c: with_costs({**dense, **record_calls("zen", t, rows, seed, choice=c)}, cost, world)
                     for c in ("bp", "hc")}
            results[name] = _zen(plat, t, paths)
        else:
            own = with_costs({**dense, **record_calls(name, t, rows, seed)}, cost, world)
            results[name] = engine.simulate(plat, step_streams("hook", world, t, own))
    return results


def _zen(plat: platform.Platform, t: Timeline, paths: dict[str, Calls]) -> StepResult:
    """zen's step with the BP-or-HC choice made per embedding part by the simulated step time."""
    world = plat.world_size
    chosen = dict(paths["bp"])
    best = engine.simulate(plat, step_streams("hook", world, t, chosen))
    for key, hc in paths["hc"].items():
        if hc == chosen[key]:
            continue  # a dense part: the same either way
        trial = {**chosen, key: hc}
        result = engine.simulate(plat, step_streams("hook", world, t, trial))
        if result.step_s < best.step_s:
            chosen, best = trial, result
    return best
