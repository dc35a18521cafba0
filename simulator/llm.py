"""Figs 13/14 simulated: an LLM trained with DGC top-5% on every bucket (zen.md section 5 step 4: tensor
parallelism 8 inside a machine, data parallelism across machines), 2-16 machines x 8 V100, 25 and 100 Gbps.

What stands in for what, as far as the model applies:

- **Which elements DGC chooses** comes from a real run: `zen profile --compress dgc` trains GPT-2 (`scaled`,
  13.3M parameters) as N data-parallel workers, each with its own DGC residual, and records the elements each
  chose at its last step (workloads/profile.py `record`). Trace worker m is machine m's replica.
- **Tensor parallelism**: GPU j of a machine holds slice j of every parameter (each tensor's elements cut in 8
  contiguous pieces, as Megatron-style TP gives every GPU a piece of every layer); it synchronizes its slice
  with GPU j of every other machine: 8 groups of `nodes` GPUs, the 8 GPUs of a machine sharing its NIC.
- **Size**: the LLM's slice is the trace's slice pattern (the transformer blocks', `EMBEDDINGS` left out) repeated
  k = LLM parameters / GPT-2 blocks' times
  (`simulator.widths.tiled`): density, overlap between machines and the clustering OmniReduce's 256-element
  blocks see are GPT-2's; each scheme's messages are recorded from the real code on the trace's slices.
- **Compute** is a stated roofline (`TOKENS` per replica, 6 FLOPs per parameter and token, split over the
  machine's 8 GPUs at `V100_UTILIZATION`); tensor parallelism's own activation traffic over NVLink is left out
  (the same for every scheme); the whole gradient is one bucket ready at the end of backward (no overlap), and
  each sparse call charges one pass over the slice at the paper's hashing rate.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from simulator import engine, platform
from simulator.paper import (
    NVLINK_BPS,
    V100_FLOPS,
    V100_HASH_RATE,
    V100_UTILIZATION,
    _global,
    record_cross,
    step_fields,
    variants,
)
from simulator.schedule import Comm, Compute, Item, StepResult
from simulator.step import step_streams
from simulator.timeline import Bucket, Param, Timeline
from simulator.widths import OMNI_BLOCK, tiled
from zen.registry import make_scheme
from zen.twolevel import shard_bounds

TP = 8  # tensor parallelism inside a machine (the paper's LLM runs)
# GPT-2's token and position embeddings and its head: 97% of the `scaled` preset's parameters, about 5% of a
# 2.7B LLM's (OPT-2.7B: 50,272 x 2,560 of 2.7B), so the LLM's slices repeat the transformer blocks' pattern alone
EMBEDDINGS = ("wte", "wpe", "lm_head")
TOKENS = 4 * 2048  # stated assumption: tokens one replica (machine) trains on per step, 4 sequences of 2,048


@dataclass(frozen=True)
class LLM:
    paper_name: str
    params: float
    source: str


MODELS = {
    "opt-2.7b": LLM("OPT-2.7B", 2.7e9, "Zhang et al. 2022, OPT: 2.7B parameters"),
    "llama3.2-3b": LLM("Llama3.2-3B", 3.21e9, "Meta's Llama 3.2 model card: 3.21B parameters"),
    "gemma2-2b": LLM("Gemma2-2B", 2.61e9, "Gemma 2 report: 2.61B parameters"),
}


def load_step(trace: Path, body: bool = True) -> tuple[list[int], list[list[torch.Tensor]]]:
    """A `zen profile --compress` traces.pt: each parameter's element count, and per worker the ids it chose in
    every parameter (the last step). `body`: the transformer blocks' parameters only (not `EMBEDDINGS`)."""
    data = torch.load(trace, weights_only=True)
    if any(int(p["width"]) != 1 for p in data["params"]):
        raise ValueError(f"{trace}: not a compressor's trace (`zen profile --compress`): rows wider than 1")
    keep = [k for k, p in enumerate(data["params"]) if not (body and any(e in p["name"] for e in EMBEDDINGS))]
    if not keep:
        raise ValueError(f"{trace}: no transformer-block parameters in the trace")
    return ([int(data["params"][k]["rows"]) for k in keep],
            [[w[k].long() for k in keep] for w in data["indices"][-1]])


def tp_slices(sizes: list[int], chosen: list[list[torch.Tensor]], gpus: int
              ) -> tuple[list[int], list[list[torch.Tensor]]]:
    """Each GPU's slice (piece j of every parameter, in order): its element count, and per machine the ids (in
    the slice) of the elements the machine's replica chose there."""
    cuts = [shard_bounds(n, gpus) for n in sizes]
    slice_sizes = [sum(c[j + 1] - c[j] for c in cuts) for j in range(gpus)]
    out = []
    for ids in chosen:
        per_gpu = []
        for j in range(gpus):
            parts, base = [], 0
            for c, got in zip(cuts, ids, strict=True):
                mine = got[(got >= c[j]) & (got < c[j + 1])]
                parts.append(mine - c[j] + base)
                base += c[j + 1] - c[j]
            per_gpu.append(torch.cat(parts))
        out.append(per_gpu)
    return slice_sizes, out


def pattern(sizes: list[int], chosen: list[list[torch.Tensor]], block: int = OMNI_BLOCK) -> tuple[float, float]:
    """What the machines' choices look like together: the density of their union, and the share of `block`-element
    blocks of each TP slice (OmniReduce's unit) that hold one of the union's elements."""
    slice_sizes, slices = tp_slices(sizes, chosen, TP)
    union = [torch.unique(torch.cat([m[j] for m in slices])) for j in range(TP)]
    touched = sum(len(torch.unique(u // block)) for u in union)
    return sum(len(u) for u in union) / sum(slice_sizes), touched / sum(-(-n // block) for n in slice_sizes)


def tiles(model: LLM, numel: int) -> int:
    """How many times the trace's pattern repeats in the LLM (its parameters over the trace's elements)."""
    return max(1, round(model.params / numel))


def roofline(model: LLM, tokens: int = TOKENS) -> float:
    """Seconds of forward and backward on one GPU: 6 x parameters x tokens FLOPs over the machine's TP GPUs."""
    return 6 * model.params * tokens / (TP * V100_FLOPS * V100_UTILIZATION)


def sync_calls(scheme: str, options: dict[str, object], slices: list[list[torch.Tensor]], sizes: list[int],
               k: int) -> list[list[Item]]:
    """Per GPU (machine by machine), its slice's sync across machines at k times the trace's size: a ring
    all-reduce among its group for a dense scheme, else the real scheme's recorded messages and one pass over
    the slice at the paper's hashing rate."""
    nodes, gpus = len(slices), len(sizes)
    if not make_scheme(scheme, **options).sparse_input:
        return [[Comm("all_reduce", "dgc", nbytes=4 * k * sizes[g % gpus],
                      group=tuple(m * gpus + g % gpus for m in range(nodes)))] for g in range(nodes * gpus)]
    cross = record_cross(scheme, slices, sizes, 1, **options)
    return [[Compute(k * sizes[j] / V100_HASH_RATE),
             *[_global(i, j, gpus, nodes) for i in tiled(cross[j][m], k) if isinstance(i, Comm)]]
            for m in range(nodes) for j in range(gpus)]


def scheme_steps(sizes: list[int], chosen: list[list[torch.Tensor]], model: LLM, nodes: int, rates: list[float],
             schemes: list[str], latency_s: float = 10e-6, jobs: int = 1) -> dict[float, dict[str, StepResult]]:
    """Each scheme's step on `nodes` machines x TP GPUs at every NIC rate, "none" computing only; zen is the
    fastest of its plans (simulator.paper.ZEN_PATHS), as its trial picks."""
    if len(chosen) < nodes:
        raise ValueError(f"the trace has {len(chosen)} workers, fewer than {nodes} machines")
    slice_sizes, slices = tp_slices(sizes, chosen[:nodes], TP)
    k = tiles(model, sum(sizes))
    compute = roofline(model)
    shard = Param("slice", (k * max(slice_sizes), 1), True)
    t = Timeline(compute / 3, 2 * compute / 3, 0.0, [Bucket(2 * compute / 3, (shard,))],
                 source=f"roofline: 6 x {model.params:.3g} parameters x {TOKENS} tokens over {TP} V100s at "
                        f"{V100_UTILIZATION:.0%} of {V100_FLOPS / 1e12:g} TFLOP/s")
    keys: list[tuple[str, str, dict[str, object]]] = [(n, s, o) for n in schemes for s, o in variants(n)]
    streams = [step_streams("none", nodes * TP, t)]
    for _, scheme, options in keys:
        calls = sync_calls(scheme, options, slices, slice_sizes, k)
        streams.append(step_streams("hook", nodes * TP, t, {(0, 0): calls}, lanes=1))
    out: dict[float, dict[str, StepResult]] = {}
    for rate in rates:
        plat = platform.gpu_cluster(nodes, TP, rate, NVLINK_BPS, latency_s)
        base, *results = engine.run_steps([(plat, st) for st in streams], jobs)
        best: dict[str, StepResult] = {"none": base}
        for (name, _, _), r in zip(keys, results, strict=True):
            if name not in best or r.step_s < best[name].step_s:
                best[name] = r
        out[rate] = best
    return out


def table(profile: Path, model_name: str, node_counts: list[int], rates: list[float], schemes: list[str],
          jobs: int = 1) -> list[dict[str, object]]:
    """CSV rows: every scheme's simulated step per machine count and NIC rate, Zen's speedups over it (step and
    exposed communication)."""
    sizes, chosen = load_step(profile / "traces.pt")
    model = MODELS[model_name]
    numel = sum(sizes)
    density = sum(sum(len(i) for i in w) for w in chosen) / len(chosen) / numel
    out: list[dict[str, object]] = []
    for nodes in node_counts:
        union, blocks = pattern(sizes, chosen[:nodes])
        for rate, res in scheme_steps(sizes, chosen, model, nodes, rates, schemes, jobs=jobs).items():
            for name, fields in step_fields(res).items():
                out.append({"model": model_name, "paper_name": model.paper_name, "scheme": name, "nodes": nodes,
                            "gpus_per_node": TP, "world_size": nodes * TP, "bandwidth_gbps": rate / 1e9, **fields,
                            "tokens_per_s": nodes * TOKENS / res[name].step_s, "density": density,
                            "union_density": union, "block_density": blocks, "trace_params": numel,
                            "tiles": tiles(model, numel), "params_source": model.source,
                            "source": str(profile)})
            print(f"nodes={nodes:3d} {rate / 1e9:g} Gbps  " + "  ".join(
                f"{n}={res[n].step_s * 1e3:.0f}ms" for n in res))
    return out
