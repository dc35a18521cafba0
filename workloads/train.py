"""`zen train`: data-parallel training of a workload under DDP with a Zen communication hook.

Routing (paper §5 step 1) is the library's: `ZenHookState(sparse_params=...)` sends the workload's
embedding gradients (`Workload.sparse_params`) through the chosen scheme as table rows and every other
gradient through dense allreduce, asynchronously while backward goes on (zen/ddp).

Besides Zen's schemes, PyTorch's own hooks run as they are (workloads/torch_hooks.py): `none` (no-op hook,
compute-only headroom), `ddp` (no hook: DDP's built-in allreduce), `bf16`, `powersgd-R`. `--compress`
(zen.compress) applies a compressor to the sparse schemes (every dense part, the embeddings keep their
natural sparsity); `allreduce` and PyTorch's hooks stay uncompressed: the dense training it is compared with.
Beware `ddp` with nn.Embedding(sparse=True) on gloo: DDP's built-in all-reduce of COO gradients corrupts
the heap now and then (torch 2.13.0+cpu; workloads/torch_hooks.py), and where two such gradients share
their values tensor (embeddings whose outputs are summed) DDP divides each in place by the world size
(Reducer::mark_variable_ready_sparse) while gloo reduces it: wrong, racy averages.

`--torchrec dp|mixed` trains the workload's torchrec embedding collections sharded by DistributedModelParallel
instead (workloads/torchrec_mode.py): every table data-parallel, or the largest table-wise and the rest
data-parallel; Zen's schemes go through zen.integrations.torchrec, next to torchrec's own wrapping
(`torchrec`, `torchrec-fp16`) and the no-op hook (`none`).

Several schemes run in one launch (`--scheme none,allreduce,zen`), each with its own model, optimizer and
data stream from the same seed, so loss curves compare step by step. Their steps are interleaved (step 1
of every scheme, then step 2, ...; `--no-interleave` trains one after the other, which needs one model's
memory instead of all), so a drift of the machine's speed hits every scheme alike and ratios within one
run hold still. Times are medians with their 25th-75th percentile range; throughput comes from the same
median. `comm_busy_s` is how long the hook's communication was in flight per step (overlapping backward
or not); with `none` in the run, `comm_exposed_s` is a scheme's step time minus the no-communication step
time: the communication the step actually waits for.

Time per iteration excludes fetching the batch (synthetic data generation is not the workload's cost).
Every timed step starts from a barrier (untimed), so all ranks start it together: interleaved, a scheme
would otherwise be charged for the previous one's skew (after `none`, whose ranks end up to hundreds of
milliseconds apart on a shared machine, the first rank to start would wait that long inside the next
scheme's first collective, and a step's time is its slowest rank's).
Launch: `zen train ... --world-size N` spawns N local gloo ranks (harness.launch.spawn) and shows rank 0's
progress; `torchrun --nproc-per-node 8 -m workloads.train ...` (RANK/WORLD_SIZE set) runs one rank per
process, NCCL on cuda:LOCAL_RANK when CUDA is available. Rank 0 writes one JSON (atomically) and logs to wandb
(workloads/train_report.py).
"""

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import zen
import zen.compress
from harness.provenance import write_json
from workloads.base import Workload, build_workload
from workloads.records import Step
from workloads.torch_hooks import NO_COMM, is_torch_hook, register
from workloads.train_args import add_arguments, import_plugins, resolve, with_defaults
from workloads.train_config import TrainConfig
from workloads.train_report import log_wandb, print_table, report_of
from zen.core.synchronizer import DENSE
from zen.ddp import StepRecord, ZenHookState, ddp_hook

log = logging.getLogger(__name__)



# ---------------------------------------------------------------- one rank


@dataclass
class Trainee:
    """One scheme's training on this rank: its own model (wrapped by DDP or torchrec's DMP, both with the plain
    model as `.module`), hooks, optimizer, data and RNG; `last_step` reads the Zen hooks' record of the last step
    (None: nothing counted)."""

    scheme: str
    work: Workload
    wrapped: nn.Module
    optimizer: torch.optim.Optimizer
    batches: Iterator[Any]
    last_step: Callable[[], StepRecord] | None
    sparse: list[nn.Parameter]
    unused: list[str]
    rng: torch.Tensor
    steps: list[Step] = field(default_factory=list)


def rank_main(config: dict[str, Any]) -> dict[str, Any]:
    """Entry point of one rank (process group already initialised); returns the gathered report."""
    cfg = TrainConfig(**config)
    import_plugins(cfg.plugins)
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cfg.backend == "nccl" \
        else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if cfg.interleave:
        trainees = [setup(cfg, scheme, device) for scheme in cfg.schemes]
        train(cfg, trainees, device)
        runs = [_gather(t) for t in trainees]
    else:
        runs = []
        for scheme in cfg.schemes:
            trainee = setup(cfg, scheme, device)
            train(cfg, [trainee], device)
            runs.append(_gather(trainee))
            del trainee
    report = report_of(cfg, runs, device)
    if dist.get_rank() == 0:
        write_json(Path(cfg.out), report)
        log_wandb(cfg, report)
    return report


def setup(cfg: TrainConfig, scheme: str, device: torch.device) -> Trainee:
    """Model, DDP and hook of one scheme, from the same seed as every other scheme of the run."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(cfg.seed)  # same initial weights everywhere (DDP also broadcasts rank 0's)
    work = build_workload(cfg.workload, cfg.preset, cfg.seed)
    model = work.model.to(device)
    if cfg.torchrec:
        return _setup_torchrec(cfg, scheme, device, work, model)
    if cfg.fsdp:
        return _setup_fsdp(cfg, scheme, device, work, model)
    sparse = _sparse_params(model, work)
    unused = _unused_parameters(model, work, cfg.seed, device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                  bucket_cap_mb=cfg.bucket_cap_mb, gradient_as_bucket_view=cfg.bucket_view,
                                  find_unused_parameters=cfg.find_unused_parameters or bool(unused))
    last_step = None
    if is_torch_hook(scheme):
        register(ddp, scheme)
    else:
        state = ZenHookState(scheme=scheme, sparse_params=sparse, asynchronous=cfg.asynchronous, lanes=cfg.lanes,
                             **hook_settings(cfg, scheme))
        ddp.register_comm_hook(state, ddp_hook)
        last_step = lambda: state.last_step  # noqa: E731
    optimizer = torch.optim.SGD(model.parameters(), lr=work.lr)
    torch.manual_seed(cfg.seed * 1_000_003 + rank + 1)  # per-rank dropout streams, same for every scheme
    return Trainee(scheme, work, ddp, optimizer, work.batches(rank, world, cfg.seed), last_step, sparse, unused,
                   torch.get_rng_state())


def _setup_torchrec(cfg: TrainConfig, scheme: str, device: torch.device, work: Workload, model: nn.Module) -> Trainee:
    """The model's embedding collections sharded by torchrec's DMP under `cfg.torchrec`, with `scheme`."""
    from workloads.torchrec_mode import shard, step_records, wrapper_for
    from zen.integrations.torchrec import data_parallel_tables

    rank, world = dist.get_rank(), dist.get_world_size()
    wrapper = wrapper_for(scheme, hook_settings(cfg, scheme) if scheme in zen.schemes() else {})
    dmp, optimizer = shard(model, cfg.torchrec, wrapper, device, work.lr)
    torch.manual_seed(cfg.seed * 1_000_003 + rank + 1)
    return Trainee(scheme, work, dmp, optimizer, work.batches(rank, world, cfg.seed), step_records(wrapper),
                   data_parallel_tables(dmp), [], torch.get_rng_state())


def _setup_fsdp(cfg: TrainConfig, scheme: str, device: torch.device, work: Workload, model: nn.Module) -> Trainee:
    """The model sharded by FSDP2 with `scheme` (workloads/fsdp_mode.py)."""
    from workloads.fsdp_mode import COMPRESSED, shard

    rank, world = dist.get_rank(), dist.get_world_size()
    squeeze = hook_settings(cfg, scheme) if scheme in COMPRESSED else {}
    sharded, state = shard(work, model, scheme, device, {k: v for k, v in squeeze.items() if k != "check_every"})
    optimizer = torch.optim.SGD(model.parameters(), lr=work.lr)
    torch.manual_seed(cfg.seed * 1_000_003 + rank + 1)
    last_step = (lambda: state.last_step) if state is not None else None
    return Trainee(scheme, work, sharded, optimizer, work.batches(rank, world, cfg.seed), last_step, [], [],
                   torch.get_rng_state())


def hook_settings(cfg: TrainConfig, scheme: str) -> dict[str, Any]:
    """The Zen hook's settings from the command line: its input check, and the compressor on every scheme but
    dense allreduce."""
    squeeze = {"compress": cfg.compress, "density": cfg.density, "compress_options": compress_options(cfg)} \
        if cfg.compress and scheme != DENSE else {}
    return {"check_every": cfg.check_every, **squeeze}


def compress_options(cfg: TrainConfig) -> dict[str, Any]:
    """The compressor's options (`with_defaults`)."""
    return with_defaults(cfg.compress, cfg.compress_options)


def train(cfg: TrainConfig, trainees: list[Trainee], device: torch.device) -> None:
    """`cfg.steps` steps of every trainee, in turn; rank 0 prints progress."""
    every = cfg.log_every or max(1, cfg.steps // 10)
    for i in range(cfg.steps):
        for t in trainees:
            t.steps.append(step(t, device))
        if dist.get_rank() == 0 and ((i + 1) % every == 0 or i + 1 == cfg.steps):
            times = "  ".join(f"{t.scheme} {t.steps[-1].iter_s * 1e3:.0f}" for t in trainees)
            print(f"[zen train] step {i + 1}/{cfg.steps}  ms/step: {times}  loss {trainees[-1].steps[-1].loss:.4f}",
                  flush=True)


def step(t: Trainee, device: torch.device) -> Step:
    """One timed step (the batch is fetched and the ranks meet before the clock starts)."""
    batch = _to_device(next(t.batches), device)
    torch.set_rng_state(t.rng)
    _sync_device(device)
    dist.barrier(device_ids=[device.index] if device.type == "cuda" else None)
    start = time.perf_counter()
    t.optimizer.zero_grad(set_to_none=True)
    loss = t.work.loss(t.wrapped, batch)
    loss.backward()
    t.optimizer.step()
    _sync_device(device)
    elapsed = time.perf_counter() - start
    t.rng = torch.get_rng_state()
    return _record(t, float(loss.detach()), elapsed)


def _record(t: Trainee, loss: float, elapsed: float) -> Step:
    if t.last_step is None:  # no-op hook: nothing sent; PyTorch's other hooks and torchrec's wrapping: not counted
        zero = 0 if t.scheme == NO_COMM else None
        return Step(loss, elapsed, zero, zero, zero, zero, zero, zero, None)
    last = t.last_step()
    embedded = [s for s, sparse in last.parts if sparse]
    return Step(loss=loss, iter_s=elapsed, comm_busy_s=last.busy_s(),
                bytes_sent=sum(s.traffic.bytes_sent for s in last.stats),
                bytes_received=last.bytes_received(),
                embedding_bytes_received=last.bytes_received(sparse_only=True),
                embedding_nnz=sum(s.nnz for s in embedded), embedding_parts=len(embedded),
                residual_norm=_residual_norm(last.stats),
                choice=",".join(sorted({s.choice for s in embedded if s.choice})) or None)


def _residual_norm(stats: list[zen.SyncStats]) -> float | None:
    """L2 norm over the step's parts of what the compressor has not sent yet (None: no compressor)."""
    norms = [s.extra["residual_norm"] for s in stats if "residual_norm" in s.extra]
    return sum(n * n for n in norms) ** 0.5 if norms else None


def _sparse_params(model: nn.Module, work: Workload) -> list[nn.Parameter]:
    named = dict(model.named_parameters())
    missing = [n for n in work.sparse_params if n not in named]
    if missing:
        raise ValueError(f"workload {work.name!r}: sparse_params {missing} are not parameters of its model")
    params = [named[n] for n in work.sparse_params]
    if not all(p.is_contiguous() for p in params):
        raise ValueError(f"workload {work.name!r}: embedding parameters must be contiguous")
    return params


def _unused_parameters(model: nn.Module, work: Workload, seed: int, device: torch.device) -> list[str]:
    """Parameters one local step leaves without a gradient (DDP then needs find_unused_parameters).

    The probe batch comes from an iterator of its own, so the training stream is untouched."""
    batch = _to_device(next(work.batches(0, 1, seed)), device)
    work.loss(model, batch).backward()
    unused = [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]
    model.zero_grad(set_to_none=True)
    if unused:
        log.warning("%s: parameters without gradient %s; DDP will look for unused parameters",
                    work.name, unused)
    return unused


def _describe(t: Trainee) -> dict[str, Any]:
    work, model = t.work, t.wrapped.module
    return {"name": work.name, "preset": work.preset, "local_batch_size": work.local_batch_size,
            "lr": work.lr, "sparse_params": list(work.sparse_params),
            "parameters": sum(p.numel() for p in model.parameters()),
            "embedding_parameters": sum(p.numel() for p in t.sparse), "info": _jsonable(work.info),
            "unused_parameters": t.unused}


def _jsonable(value: Any) -> Any:
    import json

    return json.loads(json.dumps(value, default=str))


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(_to_device(v, device) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(v, device) for v in batch)
    return batch


def _sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------- report


def _gather(t: Trainee) -> dict[str, Any]:
    """Every rank's records of one run, on every rank (after training: no effect on timings)."""
    per_rank: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, [asdict(s) for s in t.steps])
    layouts = sorted({str(p.grad.layout) for p in t.sparse if p.grad is not None})
    return {"scheme": t.scheme, "records": per_rank, "embedding_grad_layout": layouts, "workload": _describe(t)}


def run(args: argparse.Namespace) -> int:
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ and not dist.is_initialized()
    try:
        cfg = resolve(args, torchrun)
    except (ValueError, zen.ZenInputError) as exc:
        print(f"zen train: error: {exc}", file=sys.stderr)
        return 2
    if torchrun:
        dist.init_process_group(cfg.backend)
        try:
            report = rank_main(asdict(cfg))
        finally:
            dist.destroy_process_group()
        if int(os.environ["RANK"]) != 0:
            return 0
    else:
        report = _spawn_ranks(cfg)
    print_table(report)
    print(f"wrote {cfg.out}")
    return 0


def _spawn_ranks(cfg: TrainConfig) -> dict[str, Any]:
    """Local gloo ranks on loopback, or each in its own namespace behind a shaped link (--bandwidth)."""
    from harness.launch import spawn

    def launch(**where: Any) -> dict[str, Any]:
        return spawn("workloads.train:rank_main", cfg.world_size, {"config": asdict(cfg)}, backend=cfg.backend,
                     timeout_s=float(os.environ.get("ZEN_TRAIN_TIMEOUT_S", 3600)), echo=sys.stderr, **where)[0]

    if not cfg.bandwidth:
        return launch()
    from harness.netem import emulated_cluster

    with emulated_cluster(cfg.world_size, cfg.bandwidth) as cluster:
        return launch(**cluster.spawn_kwargs())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workloads.train", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
