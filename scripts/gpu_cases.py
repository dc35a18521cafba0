"""Rank bodies of the GPU checks (scripts/gpu_check.py: ranks sharing one GPU over gloo; scripts/nccl_check.py:
one GPU per rank over NCCL), spawned by harness.launch with this folder on PYTHONPATH."""

from __future__ import annotations

import copy
import json
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from ddp_user_script import DenseNet, Recommender, train, zipf_ids
from torch.nn.parallel import DistributedDataParallel as DDP

import zen
import zen.ddp.hook as hook_module
from harness.gpucheck.syncs import SyncCounter
from harness.gpucheck.trace import Overlap
from harness.gpucheck.trace import overlap as trace_overlap
from harness.reference import matches_reference, reference_sum


def device() -> torch.device:
    """This rank's GPU: its own under NCCL (harness.launch made it current), the shared one under gloo."""
    return torch.device("cuda", torch.cuda.current_device())


def hook_vs_ddp(sparse: tuple[bool, ...] = (False, True), steps: int = 8) -> dict[bool, dict[str, Any]]:
    """The Recommender trained with DDP's built-in allreduce and with the Zen hook on CUDA tensors, for dense
    and COO embedding gradients."""
    dev = str(device())
    out = {}
    for coo in sparse:
        runs = {hook: train(hook, coo, steps=steps, warmup=2, rows=20_000, device=dev) for hook in ("ddp", "zen")}
        out[coo] = {hook: {"losses": r["losses"], "checksum": r["checksum"]} for hook, r in runs.items()}
    return out


def _batch(gen: torch.Generator, dev: torch.device, rows: int = 20_000) -> tuple[torch.Tensor, torch.Tensor]:
    return zipf_ids(gen, rows, (512,)).to(dev), zipf_ids(gen, rows, (512, 20)).to(dev)


def _with_host_read(hook: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """The sync check's negative control: `hook` after one host read of the bucket (but the step's last)."""

    def reading(state, bucket):  # no annotations: DDP's register_comm_hook rejects string ones
        if not bucket.is_last():
            float(bucket.buffer().sum())
        return hook(state, bucket)

    return reading


def syncs_per_step(cases: list[tuple[bool, bool]], steps: int = 6) -> list[dict[str, int]]:
    """Host synchronizations during one steady-state backward (torch.cuda.set_sync_debug_mode), by where they
    happened (harness.gpucheck.syncs), per case (COO embeddings?, a host read injected in the hook?)."""
    return [_syncs(sparse, inject, steps) for sparse, inject in cases]


def _syncs(sparse: bool, inject: bool, steps: int) -> dict[str, int]:
    dev = device()
    torch.manual_seed(0)
    model = Recommender(20_000, 64, sparse).to(dev)
    ddp = DDP(model, device_ids=[dev.index], bucket_cap_mb=2)  # several buckets: calls that are not the last
    state = zen.ZenHookState(scheme="zen", sparse_params=model, check_every=0)
    counter = SyncCounter()
    ddp.register_comm_hook(state, counter.wrap(_with_host_read(zen.ddp_hook) if inject else zen.ddp_hook))
    gen = torch.Generator().manual_seed(dist.get_rank())
    for step in range(steps):
        loss = ddp(*_batch(gen, dev)).pow(2).mean()
        if step < steps - 1:
            loss.backward()
            continue
        torch.cuda.synchronize()
        with counter.counting():
            torch.cuda.set_sync_debug_mode("warn")
            try:
                loss.backward()
            finally:
                torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return dict(counter.counts) | {"buckets": len(state.last_step.spans),
                                   "rounds": sum(s.traffic.rounds for s in state.last_step.stats),
                                   "counted_reads": sum(s.traffic.host_reads for s in state.last_step.stats)}


class _LateFuture(torch.futures.Future):
    """The race check's probe: when the hook completes a bucket, its result is poisoned (NaN) on the lane's
    stream, in memory before the Future completes, and written back only after a long kernel on that stream.
    Whoever reads the result without waiting for the lane's stream reads NaN. `devices=None` is the negative
    control: a Future without the stream dependency that DDP needs."""

    def __init__(self, lane: torch.cuda.Stream, cycles: int, devices: list[torch.device] | None):
        super().__init__(devices=devices)
        self.lane, self.cycles = lane, cycles

    def set_result(self, result: Any) -> None:
        if isinstance(result, torch.Tensor) and result.is_cuda and result.layout == torch.strided:
            with torch.cuda.stream(self.lane):
                self.lane.wait_stream(torch.cuda.current_stream())
                saved = result.clone()
                result.fill_(float("nan"))
                self.lane.synchronize()
                torch.cuda._sleep(self.cycles)
                result.copy_(saved)
        super().set_result(result)


def race(cycles: int = 50_000_000, steps: int = 3) -> dict[str, Any]:
    """What DDP hands the optimizer, read on the default stream right after backward, against the float64 mean
    of every rank's local gradients: with the hook's own Future (the check) and with one that lacks the stream
    dependency (the negative control), both with late writes on the lane's stream (`_LateFuture`)."""
    return {variant: _race(variant == "control", cycles, steps) for variant in ("check", "control")}


def _race(plain: bool, cycles: int, steps: int) -> dict[str, Any]:
    dev = device()
    torch.manual_seed(0)
    model = Recommender(20_000, 64, False).to(dev)
    local = copy.deepcopy(model)  # this rank's own gradients, no DDP
    ddp = DDP(model, device_ids=[dev.index], bucket_cap_mb=2)
    state = zen.ZenHookState(scheme="zen", sparse_params=model, lanes=1)
    ddp.register_comm_hook(state, zen.ddp_hook)
    gen = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(steps - 1):
        ddp(*_batch(gen, dev)).pow(2).mean().backward()
    batch = _batch(gen, dev)
    model.zero_grad(set_to_none=True)
    made: list[_LateFuture] = []

    def late(dev_: torch.device) -> torch.futures.Future:
        made.append(_LateFuture(state.runtime.opened[0].stream.cuda, cycles, None if plain else [dev_]))
        return made[-1]

    with _patched(hook_module, "result_future", late):
        ddp(*batch).pow(2).mean().backward()
        read = torch.cat([p.grad.reshape(-1) for p in model.parameters()])  # on the default stream, no wait
    local(*batch).pow(2).mean().backward()
    mine = torch.cat([p.grad.reshape(-1) for p in local.parameters()]).double().cpu()
    every: list[torch.Tensor] = [torch.empty(0)] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    want = torch.stack(every).sum(0) / len(every)
    got = read.double().cpu()
    tol = 1e-5 * float(want.abs().max()) + 1e-7
    wrong = ~torch.isclose(got, want, rtol=1e-4, atol=tol)
    return {"futures": len(made), "wrong": int(wrong.sum()), "numel": got.numel(),
            "nan": int(got.isnan().sum()), "worst": float((got - want).abs().nan_to_num(float("inf")).max())}


@contextmanager
def _patched(module: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


def overlap(steps: int = 4, trace_dir: str | None = None) -> dict[str, Overlap]:
    """A torch.profiler timeline of one backward of a 50M-parameter MLP whose buckets all go through the hook
    (flat zen): the overlap of the lanes' device work with backward's (harness.gpucheck.trace), for the hook
    as it is (the check) and lane-free (the negative control: every bucket inside the hook call, on
    backward's own stream)."""
    return {variant: _overlap(variant == "control", steps, trace_dir) for variant in ("check", "control")}


def _overlap(lane_free: bool, steps: int, trace_dir: str | None) -> Overlap:
    from torch.profiler import ProfilerActivity, profile

    dev = device()
    torch.manual_seed(0)
    model = DenseNet().to(dev)
    ddp = DDP(model, device_ids=[dev.index])
    state = zen.ZenHookState(scheme="zen")
    ddp.register_comm_hook(state, zen.ddp_hook)
    x = torch.randn(8192, 2048, generator=torch.Generator().manual_seed(dist.get_rank())).to(dev)
    for _ in range(steps - 1):
        ddp(x).pow(2).mean().backward()
    if lane_free:
        state.asynchronous = False
        for lane in state.runtime.opened:
            lane.stream.cuda = torch.cuda.current_stream(dev)
    loss = ddp(x).pow(2).mean()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:  # device work only: what the overlap reads
        for stream in [torch.cuda.current_stream(dev)] + [lane.stream.cuda for lane in state.runtime.opened]:
            with torch.cuda.stream(stream):
                torch.cuda._sleep(1000)  # the marker naming this stream in the trace
            torch.cuda.synchronize()
        loss.backward()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(trace_dir or tmp, f"overlap-{'control' if lane_free else 'check'}-rank{dist.get_rank()}.json")
        prof.export_chrome_trace(str(path))
        return trace_overlap(json.loads(path.read_text()))


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
