"""Rank bodies of the GPU checks (scripts/gpu_check.py: ranks sharing one GPU over gloo; scripts/nccl_check.py:
one GPU per rank over NCCL), spawned by harness.launch with this folder on PYTHONPATH."""

from __future__ import annotations

import threading
import time
import warnings
from collections import Counter
from typing import Any

import torch
import torch.distributed as dist
from ddp_user_script import Recommender, train, zipf_ids
from torch.nn.parallel import DistributedDataParallel as DDP

import zen
from harness.reference import matches_reference, reference_sum


def device() -> torch.device:
    """This rank's GPU: its own under NCCL (harness.launch made it current), the shared one under gloo."""
    return torch.device("cuda", torch.cuda.current_device())


def hook_vs_ddp(sparse: bool, steps: int = 8) -> dict[str, Any]:
    """The Recommender trained with DDP's built-in allreduce and with the Zen hook on CUDA tensors."""
    dev = str(device())
    runs = {hook: train(hook, sparse, steps=steps, warmup=2, rows=20_000, device=dev) for hook in ("ddp", "zen")}
    return {hook: {"losses": r["losses"], "checksum": r["checksum"]} for hook, r in runs.items()}


def syncs_per_step(sparse: bool, steps: int = 6) -> dict[str, int]:
    """Host synchronizations during one steady-state step's backward (torch.cuda.set_sync_debug_mode), by the
    thread that caused them: backward's own ("autograd"), the hook's lanes ("lane") or others."""
    dev = device()
    torch.manual_seed(0)
    model = Recommender(20_000, 64, sparse).to(dev)
    ddp = DDP(model, device_ids=[dev.index])
    state = zen.ZenHookState(scheme="zen", sparse_params=model, check_every=0)
    ddp.register_comm_hook(state, zen.ddp_hook)
    gen = torch.Generator().manual_seed(dist.get_rank())
    seen: Counter[str] = Counter()
    original = warnings.showwarning

    def record(message: Any, category: Any, *args: Any, **kwargs: Any) -> None:
        name = threading.current_thread().name
        seen["lane" if name.startswith("zen-comm") else "autograd" if name == "MainThread" else name] += 1

    for step in range(steps):
        items, hist = zipf_ids(gen, 20_000, (512,)).to(dev), zipf_ids(gen, 20_000, (512, 20)).to(dev)
        loss = ddp(items, hist).pow(2).mean()
        if step == steps - 1:
            torch.cuda.synchronize()
            warnings.showwarning = record
            torch.cuda.set_sync_debug_mode("warn")
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                loss.backward()
                torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = original
        else:
            loss.backward()
    torch.cuda.synchronize()
    return dict(seen) | {"buckets": len(state.last_step.spans),
                         "rounds": sum(s.traffic.rounds for s in state.last_step.stats),
                         "counted_reads": sum(s.traffic.host_reads for s in state.last_step.stats)}


def overlap(steps: int = 6) -> dict[str, float]:
    """A torch.profiler timeline of one step: how much of the hook's work on its lane stream runs while
    backward's kernels are still running on the default stream (ms)."""
    from torch.profiler import ProfilerActivity, profile

    dev = device()
    torch.manual_seed(0)
    model = Recommender(200_000, 64, False).to(dev)
    ddp = DDP(model, device_ids=[dev.index])
    ddp.register_comm_hook(zen.ZenHookState(scheme="zen", sparse_params=model), zen.ddp_hook)
    gen = torch.Generator().manual_seed(dist.get_rank())
    default_stream = torch.cuda.current_stream(dev).stream_id
    for step in range(steps):
        items, hist = zipf_ids(gen, 200_000, (4096,)).to(dev), zipf_ids(gen, 200_000, (4096, 20)).to(dev)
        if step < steps - 1:
            ddp(items, hist).pow(2).mean().backward()
            continue
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            ddp(items, hist).pow(2).mean().backward()
            torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    main = [e for e in kernels if getattr(e, "stream", default_stream) == default_stream]
    lane = [e for e in kernels if getattr(e, "stream", default_stream) != default_stream]
    if not main or not lane:
        return {"backward_ms": 0.0, "lane_ms": 0.0, "lane_during_backward_ms": 0.0}
    end = max(e.time_range.end for e in main)
    during = sum(max(0, min(e.time_range.end, end) - e.time_range.start) for e in lane if e.time_range.start < end)
    span = end - min(e.time_range.start for e in main)
    return {"backward_ms": span / 1e3, "lane_ms": sum(e.time_range.elapsed_us() for e in lane) / 1e3,
            "lane_during_backward_ms": during / 1e3}


def schemes_lossless(names: list[str]) -> dict[str, Any]:
    """Every scheme on CUDA tensors (three calls: zen decides on the first), lossless and alike on every rank."""
    rank, P, dev = dist.get_rank(), dist.get_world_size(), device()
    report: dict[str, Any] = {}
    for name in names:
        gen = torch.Generator().manual_seed(7)
        tensors = []
        for r in range(P):
            t = torch.zeros(1_000_003)
            idx = torch.randint(0, t.numel(), (20_000 + 1000 * r,), generator=gen)
            t[idx] = torch.randn(idx.numel(), generator=gen)
            t[0], t[-1] = 1.0 + r, -1.0
            tensors.append(t)
        total, magnitude = reference_sum(tensors)
        for _ in range(3):
            out = zen.allreduce(tensors[rank].to(dev), name)
        torch.cuda.synchronize()
        cpu = out.cpu()
        report[name] = (matches_reference(cpu, total, magnitude, P), float(cpu.double().sum()))
    return report


def killed_rank(timeout_s: float = 20.0) -> str:
    """Rank 1 leaves; the others' next sync must raise ZenCommError within about the timeout, not hang."""
    dev = device()
    t = torch.ones(1000, device=dev)
    zen.allreduce(t, "zen", timeout_s=timeout_s)
    if dist.get_rank() == 1:
        return "left"
    start = time.monotonic()
    try:
        zen.allreduce(t, "zen", timeout_s=timeout_s)
        torch.cuda.synchronize()
    except zen.ZenCommError as exc:
        return f"ZenCommError after {time.monotonic() - start:.1f}s: {str(exc)[:120]}"
    return "no error"


def two_level(ranks_per_node: int) -> tuple[bool, float]:
    rank, P, dev = dist.get_rank(), dist.get_world_size(), device()
    gen = torch.Generator().manual_seed(3)
    tensors = [torch.zeros(200_003).index_fill_(0, torch.randint(0, 200_003, (3000,), generator=gen), 1.0 + r)
               for r in range(P)]
    total, magnitude = reference_sum(tensors)
    out = zen.allreduce(tensors[rank].to(dev), "zen", ranks_per_node=ranks_per_node).cpu()
    return matches_reference(out, total, magnitude, P), float(out.double().sum())
