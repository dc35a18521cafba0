"""`zen train`: data-parallel training of a workload under DDP with a Zen communication hook.

Routing (paper §5 step 1): only the embedding gradients (`Workload.sparse_params`) take the chosen
scheme; every other gradient goes through dense allreduce. DDP decides the buckets (and rebuilds them
after iteration 1), so instead of trying to isolate the embeddings in buckets of their own, the hook
splits every bucket into parts (`EmbeddingRouter`): each embedding parameter is one part synchronized
as rows of its table (COO over the first dim, so one index per row, not per element), and each run of
other parameters between them is one contiguous dense allreduce. Parameters of nn.Embedding(sparse=True)
have sparse COO gradients, which DDP always puts alone in a bucket; that bucket goes through the scheme
whole and the hook hands DDP back a COO tensor (DDP copy_()s the result into the sparse .grad).

Pseudo-schemes: `none` registers DDP's no-op hook (no communication: compute-only headroom, ranks
drift apart), `ddp` registers no hook at all (DDP's built-in allreduce, the default people run).
Beware `ddp` with nn.Embedding(sparse=True): DDP divides each COO gradient in place by the world size
(Reducer::mark_variable_ready_sparse) while gloo reduces it, and two such gradients may share their
values tensor (embeddings whose outputs are summed): their averages come out wrong and racy (torch 2.13).
Several schemes may run back to back in one launch (`--scheme none,allreduce,zen`): every run starts
from the same seed, so loss curves are comparable step by step, and `comm_s_vs_nocomm` is filled in.

Time per iteration excludes fetching the batch (synthetic data generation is not the workload's cost);
`hook_s` is the time spent inside the comm hook (on gloo the collectives block there), `compute_s` the
rest. Throughput = iterations/s x local batch x workers over the steps after `--warmup`.

Launch: `zen train ... --world-size N` spawns N local gloo ranks (zen.launch.spawn);
`torchrun --nproc-per-node 8 -m workloads.train ...` (RANK/WORLD_SIZE set) runs one rank per process,
NCCL on cuda:LOCAL_RANK when CUDA is available. Rank 0 writes one JSON (atomically) and logs to wandb.
(No `from __future__ import annotations`: DDP checks the hook's annotations against real classes.)
"""

import argparse
import importlib
import importlib.metadata
import json
import logging
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook
from torch.nn.parallel import DistributedDataParallel

import zen
from workloads.base import PRESETS, Workload, build_workload, workload_names
from zen.ddp_hook import Part, ZenHookState, ddp_hook
from zen.registry import make_scheme

log = logging.getLogger(__name__)

NO_COMM = "none"  # DDP's no-op hook: headroom without communication
NATIVE = "ddp"  # no comm hook: DDP's built-in allreduce
DENSE = "allreduce"  # what every non-embedding gradient goes through
REPO = Path(__file__).resolve().parents[1]


@dataclass
class TrainConfig:
    workload: str
    preset: str = "tiny"
    schemes: list[str] = field(default_factory=lambda: ["zen"])
    world_size: int = 2
    steps: int = 20
    warmup: int = 3
    seed: int = 0
    bucket_cap_mb: float | None = None
    validate: bool = True
    find_unused_parameters: bool = False
    backend: str = "gloo"
    out: str = ""
    wandb_mode: str = "offline"
    wandb_project: str = "zen"
    wandb_group: str = ""
    plugins: list[str] = field(default_factory=list)
    bandwidth: str | None = None  # emulated per-node link rate (zen/netem.py); None = loopback


# ---------------------------------------------------------------- the hook


class EmbeddingRouter:
    """ZenHookState.route: embedding parameters through `scheme` as table rows, the rest dense.

    Depends only on which parameters a bucket holds, which DDP keeps identical on all ranks."""

    def __init__(self, scheme: str, sparse_params: list[nn.Parameter]):
        self.scheme = scheme
        self.sparse = {p.data_ptr() for p in sparse_params}
        self.rows = bool(getattr(make_scheme(scheme), "sparse_input", True))
        self.kinds: list[bool] = []  # per part of the current step: is it an embedding?
        self.last_kinds: list[bool] = []

    def __call__(self, bucket: dist.GradBucket) -> str | list[Part]:
        buffer = bucket.buffer()
        params = bucket.parameters()
        if buffer.layout != torch.strided:  # a sparse COO gradient: always alone in its bucket
            embedding = params[0].data_ptr() in self.sparse
            routed: str | list[Part] = self.scheme if embedding else DENSE
            self.kinds.append(embedding)
        else:
            split = self._split(buffer, params, bucket.gradients())
            routed = [part for part, _ in split]
            self.kinds.extend(embedding for _, embedding in split)
        if bucket.is_last():
            self.last_kinds, self.kinds = self.kinds, []
        return routed

    def _split(self, buffer: torch.Tensor, params: list[torch.Tensor],
               grads: list[torch.Tensor]) -> list[tuple[Part, bool]]:
        """(part, is it embedding rows) in buffer order. DDP's gradient views lie back to back in the
        bucket, so neighbouring embedding tables of one row width form a single (rows, width) part
        (one scheme call, like a fused table) and the parameters between them one flat dense part."""
        parts: list[tuple[Part, bool]] = []
        start = offset = 0
        width: int | None = None  # row width of the pending embedding run; None: a dense run
        for p, g in zip(params, grads, strict=True):
            if (g.data_ptr() - buffer.data_ptr()) != offset * buffer.element_size() or not g.is_contiguous():
                raise RuntimeError("zen train: DDP's gradient views are not back to back in the bucket")
            p_width = math.prod(p.shape[1:]) if p.data_ptr() in self.sparse else None
            if offset > start and p_width != width:
                parts.append(self._part(buffer[start:offset], width))
                start = offset
            width = p_width
            offset += g.numel()
        if offset > start:
            parts.append(self._part(buffer[start:offset], width))
        return parts

    def _part(self, flat: torch.Tensor, width: int | None) -> tuple[Part, bool]:
        if width is None:
            return (flat, flat, DENSE), False
        view = flat.view(-1, width)
        return (view.to_sparse(1) if self.rows else view, view, self.scheme), True


@dataclass
class HookClock:
    """State of `timed_hook`: the Zen hook state (None: no-op hook) and the seconds spent inside."""

    state: ZenHookState | None
    cuda: bool
    seconds: float = 0.0


def timed_hook(clock: HookClock, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    if clock.cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    fut = noop_hook(None, bucket) if clock.state is None else ddp_hook(clock.state, bucket)
    if clock.cuda:
        torch.cuda.synchronize()
    clock.seconds += time.perf_counter() - start
    return fut


# ---------------------------------------------------------------- one rank


def rank_main(config: dict[str, Any]) -> dict[str, Any]:
    """Entry point of one rank (process group already initialised); returns the gathered report."""
    cfg = TrainConfig(**config)
    _import_plugins(cfg.plugins)
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cfg.backend == "nccl" \
        else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    runs = [_gather(train_run(cfg, scheme, device)) for scheme in cfg.schemes]
    report = _report(cfg, runs, device)
    if dist.get_rank() == 0:
        write_json(Path(cfg.out), report)
        log_wandb(cfg, report)
    return report


def train_run(cfg: TrainConfig, scheme: str, device: torch.device) -> dict[str, Any]:
    """Train `cfg.steps` steps with one scheme; returns this rank's per-step records."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(cfg.seed)  # same initial weights everywhere (DDP also broadcasts rank 0's)
    work = build_workload(cfg.workload, cfg.preset, cfg.seed)
    model = work.model.to(device)
    sparse = _sparse_params(model, work)
    unused = _unused_parameters(model, work, cfg.seed, device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                  bucket_cap_mb=cfg.bucket_cap_mb,
                                  find_unused_parameters=cfg.find_unused_parameters or bool(unused))
    state, router, clock = _register_hook(ddp, scheme, sparse, cfg.validate, device)
    optimizer = torch.optim.SGD(model.parameters(), lr=work.lr)
    torch.manual_seed(cfg.seed * 1_000_003 + rank + 1)  # per-rank dropout streams, same for every scheme
    batches = work.batches(rank, world, cfg.seed)
    rec: dict[str, list] = {k: [] for k in ("loss", "iter_s", "hook_s", "compute_s", "bytes_sent",
                                            "bytes_received", "embedding_bytes_received", "embedding_nnz",
                                            "embedding_parts", "choice")}
    for _ in range(cfg.steps):
        batch = _to_device(next(batches), device)
        _sync_device(device)
        if clock is not None:
            clock.seconds = 0.0
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = work.loss(ddp, batch)
        loss.backward()
        optimizer.step()
        _sync_device(device)
        rec["iter_s"].append(time.perf_counter() - start)
        rec["hook_s"].append(clock.seconds if clock is not None else None)
        rec["compute_s"].append(rec["iter_s"][-1] - clock.seconds if clock is not None else None)
        rec["loss"].append(float(loss.detach()))
        _record_traffic(rec, scheme, state, router)
    layouts = sorted({str(p.grad.layout) for p in sparse if p.grad is not None})
    return {"scheme": scheme, "records": rec, "embedding_grad_layout": layouts,
            "workload": {**_describe(work, model, sparse), "unused_parameters": unused}}


Hooked = tuple[ZenHookState | None, EmbeddingRouter | None, HookClock | None]


def _register_hook(ddp: DistributedDataParallel, scheme: str, sparse: list[nn.Parameter], validate: bool,
                   device: torch.device) -> Hooked:
    if scheme == NATIVE:
        return None, None, None
    state = router = None
    if scheme != NO_COMM:
        router = EmbeddingRouter(scheme, sparse)
        state = ZenHookState(scheme=scheme, validate=validate, route=router)
    clock = HookClock(state, cuda=device.type == "cuda")
    ddp.register_comm_hook(clock, timed_hook)
    return state, router, clock


def _record_traffic(rec: dict[str, list], scheme: str, state: ZenHookState | None,
                    router: EmbeddingRouter | None) -> None:
    if state is None or router is None:  # no-op hook: nothing sent; DDP's own allreduce: not counted
        for key in ("bytes_sent", "bytes_received", "embedding_bytes_received", "embedding_nnz",
                    "embedding_parts"):
            rec[key].append(0 if scheme == NO_COMM else None)
        rec["choice"].append(None)
        return
    stats = state.last_step_stats
    embedded = [s for s, emb in zip(stats, router.last_kinds, strict=True) if emb]
    rec["bytes_sent"].append(sum(s.traffic.bytes_sent for s in stats))
    rec["bytes_received"].append(sum(s.traffic.bytes_received for s in stats))
    rec["embedding_bytes_received"].append(sum(s.traffic.bytes_received for s in embedded))
    rec["embedding_nnz"].append(sum(s.nnz for s in embedded))
    rec["embedding_parts"].append(len(embedded))  # scheme calls per step for the embeddings
    rec["choice"].append(",".join(sorted({s.choice for s in embedded if s.choice})) or None)


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


def _describe(work: Workload, model: nn.Module, sparse: list[nn.Parameter]) -> dict[str, Any]:
    return {"name": work.name, "preset": work.preset, "local_batch_size": work.local_batch_size,
            "lr": work.lr, "sparse_params": list(work.sparse_params),
            "parameters": sum(p.numel() for p in model.parameters()),
            "embedding_parameters": sum(p.numel() for p in sparse), "info": _jsonable(work.info)}


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


def _import_plugins(modules: list[str]) -> None:
    """Modules that register extra workloads or schemes (e.g. a test's toy workload), looked up from
    the current directory too, as `python -m` would."""
    if modules and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    for module in modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            raise ValueError(f"--plugin {module}: {exc}") from exc


# ---------------------------------------------------------------- report


def _gather(run: dict[str, Any]) -> dict[str, Any]:
    """Every rank's records of one run, on every rank (after training: no effect on timings)."""
    per_rank: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, run["records"])
    return {**run, "records": per_rank}


def _report(cfg: TrainConfig, runs: list[dict[str, Any]], device: torch.device) -> dict[str, Any]:
    config = {**asdict(cfg), "device": str(device), "workload_info": runs[0]["workload"]}
    report = {"config": config, "versions": _versions(), "git": _git(),
              "runs": [_summarize(cfg, run) for run in runs]}
    nocomm = next((r for r in report["runs"] if r["scheme"] == NO_COMM), None)
    for run in report["runs"]:
        if nocomm is not None:
            run["summary"]["comm_s_vs_nocomm"] = run["summary"]["iter_s_median"] - \
                nocomm["summary"]["iter_s_median"]
    return report


def _summarize(cfg: TrainConfig, run: dict[str, Any]) -> dict[str, Any]:
    ranks = run["records"]
    steps = {key: _across(ranks, key, reduce) for key, reduce in (
        ("loss", statistics.fmean),  # the global loss: mean of the ranks' losses
        ("iter_s", max), ("hook_s", max), ("compute_s", max),  # a step ends when its slowest rank ends
        ("bytes_sent", statistics.fmean), ("bytes_received", statistics.fmean),
        ("embedding_bytes_received", statistics.fmean), ("embedding_nnz", statistics.fmean),
        ("embedding_parts", max))}
    steps["choice"] = list(ranks[0]["choice"])
    timed = slice(cfg.warmup, None)
    iters = steps["iter_s"][timed]
    rate = len(iters) / sum(iters)
    summary = {
        "iter_s_median": statistics.median(iters), "iter_s_mean": statistics.fmean(iters),
        "iter_s_max": max(iters), "hook_s_median": _median(steps["hook_s"][timed]),
        "compute_s_median": _median(steps["compute_s"][timed]), "iters_per_s": rate,
        "samples_per_s": rate * run["workload"]["local_batch_size"] * len(ranks),
        "final_loss": steps["loss"][-1], "zen_choice": steps["choice"][-1],
        **{f"{key}_per_step": _mean(steps[key][timed])
           for key in ("bytes_sent", "bytes_received", "embedding_bytes_received", "embedding_nnz",
                       "embedding_parts")},
        "bytes_received_per_step_max_rank": _max([_mean(r["bytes_received"][timed]) for r in ranks]),
    }
    return {"scheme": run["scheme"], "embedding_grad_layout": run["embedding_grad_layout"],
            "summary": summary, "steps": steps,
            "per_rank": {k: [r[k] for r in ranks] for k in ("loss", "iter_s", "hook_s", "bytes_received")}}


def _across(ranks: list[dict[str, list]], key: str, reduce: Any) -> list[Any]:
    columns = zip(*(r[key] for r in ranks), strict=True)
    return [None if any(v is None for v in col) else reduce(col) for col in columns]


def _median(values: list[float | None]) -> float | None:
    return None if not values or None in values else statistics.median(values)


def _mean(values: list[float | None]) -> float | None:
    return None if not values or None in values else statistics.fmean(values)


def _max(values: list[float | None]) -> float | None:
    return None if not values or None in values else max(values)


def _versions() -> dict[str, str | None]:
    def version(dist_name: str) -> str | None:
        try:
            return importlib.metadata.version(dist_name)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {"python": platform.python_version(), "torch": torch.__version__, "zen": zen.__version__,
            "wandb": version("wandb"), "cuda": torch.version.cuda, "platform": platform.platform()}


def _git() -> dict[str, Any]:
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no")
    return {"revision": git("rev-parse", "HEAD"), "dirty": None if status is None else bool(status)}


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def write_json(path: Path, report: dict[str, Any]) -> None:
    """Write atomically: a reader never sees a half-written file (tmp in the same folder + rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as tmp:
        json.dump(report, tmp, indent=1)
    os.replace(tmp.name, path)


def log_wandb(cfg: TrainConfig, report: dict[str, Any]) -> None:
    """Best effort (the JSON already holds everything): a wandb failure, e.g. `online` without a
    network, is logged, not raised."""
    if cfg.wandb_mode == "disabled":
        return
    try:
        _log_wandb(cfg, report)
    except Exception as exc:  # an optional sink must not lose a finished run
        log.warning("wandb logging failed (%s: %s); results are in %s", type(exc).__name__, exc, cfg.out)


def _log_wandb(cfg: TrainConfig, report: dict[str, Any]) -> None:
    """One wandb run per scheme, grouped by `cfg.wandb_group` so schemes line up in one chart;
    files go to <folder of the JSON>/wandb."""
    import wandb

    wandb_dir = Path(cfg.out).parent / "wandb"
    wandb_dir.mkdir(parents=True, exist_ok=True)
    for run in report["runs"]:
        name = f"{cfg.workload}-{cfg.preset}-{run['scheme']}-P{cfg.world_size}"
        handle = wandb.init(project=cfg.wandb_project, group=cfg.wandb_group, name=name, job_type="train",
                            mode=cfg.wandb_mode, dir=str(wandb_dir),
                            config={**report["config"], "scheme": run["scheme"], "git": report["git"]})
        steps = run["steps"]
        for i, loss in enumerate(steps["loss"]):
            handle.log({k: steps[k][i] for k in ("iter_s", "hook_s", "bytes_received",
                                                 "embedding_bytes_received") if steps[k][i] is not None}
                       | {"loss": loss}, step=i)
        handle.summary.update({k: v for k, v in run["summary"].items() if v is not None})
        handle.finish()


# ---------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", required=True, help="one of the registered workloads")
    parser.add_argument("--preset", default="tiny", help=f"one of {', '.join(PRESETS)}")
    parser.add_argument("--scheme", default="zen",
                        help=f"scheme(s), comma-separated: registered schemes, {NO_COMM!r} (no-op hook) "
                             f"or {NATIVE!r} (DDP's own allreduce, no hook)")
    parser.add_argument("--world-size", type=int, default=None,
                        help="ranks to spawn (default 2); under torchrun taken from WORLD_SIZE")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=None,
                        help="steps left out of the throughput (default min(3, steps // 2))")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bucket-cap-mb", type=float, default=None, help="DDP bucket size (default 25)")
    parser.add_argument("--no-validate", action="store_true",
                        help="skip the hook's cross-rank input check (one small all-gather per part)")
    parser.add_argument("--find-unused-parameters", action="store_true")
    parser.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto",
                        help="auto: NCCL under torchrun when CUDA is available, else gloo")
    parser.add_argument("--out", default=None, help="result JSON (default results/train/<run>.json)")
    parser.add_argument("--wandb-mode", choices=("offline", "online", "disabled"), default=None,
                        help="default: $WANDB_MODE, else offline")
    parser.add_argument("--wandb-project", default="zen")
    parser.add_argument("--wandb-group", default=None, help="default <workload>-<preset>-P<world size>")
    parser.add_argument("--bandwidth", default=None,
                        help="emulated per-node link rate, e.g. 1gbit (needs root or user namespaces)")
    parser.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                        help="import MODULE on every rank first (registers extra workloads/schemes)")


def resolve(args: argparse.Namespace, torchrun: bool) -> TrainConfig:
    """Check names and numbers before any process starts; ValueError says what is wrong."""
    _import_plugins(args.plugin)
    names = workload_names()
    if args.workload not in names:
        raise ValueError(f"unknown workload {args.workload!r}; choose one of: {', '.join(names)}")
    if args.preset not in PRESETS:
        raise ValueError(f"unknown preset {args.preset!r}; choose one of: {', '.join(PRESETS)}")
    schemes = [s.strip() for s in args.scheme.split(",") if s.strip()]
    known = [*zen.schemes(), NO_COMM, NATIVE]
    bad = [s for s in schemes if s not in known]
    if bad or not schemes:
        raise ValueError(f"unknown scheme {', '.join(bad) or repr(args.scheme)}; "
                         f"choose from: {', '.join(known)}")
    world = _world_size(args, torchrun)
    warmup = min(3, args.steps // 2) if args.warmup is None else args.warmup
    if args.steps <= warmup or warmup < 0:
        raise ValueError(f"--steps ({args.steps}) must exceed --warmup ({warmup}) >= 0")
    if args.bandwidth and torchrun:
        raise ValueError("--bandwidth emulates a cluster on one machine; under torchrun the network is real")
    if args.bandwidth:
        from zen.netem import parse_rate

        parse_rate(args.bandwidth)
    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torchrun and torch.cuda.is_available() else "gloo"
    run_name = f"{args.workload}-{args.preset}-{'+'.join(schemes)}-P{world}"
    return TrainConfig(
        workload=args.workload, preset=args.preset, schemes=schemes, world_size=world, steps=args.steps,
        warmup=warmup, seed=args.seed, bucket_cap_mb=args.bucket_cap_mb, validate=not args.no_validate,
        find_unused_parameters=args.find_unused_parameters, backend=backend,
        out=str(Path(args.out or Path("results", "train", f"{run_name}.json")).resolve()),
        wandb_mode=args.wandb_mode or os.environ.get("WANDB_MODE") or "offline",
        wandb_project=args.wandb_project,
        wandb_group=args.wandb_group or f"{args.workload}-{args.preset}-P{world}", plugins=list(args.plugin),
        bandwidth=args.bandwidth)


def _world_size(args: argparse.Namespace, torchrun: bool) -> int:
    if torchrun:
        world = int(os.environ["WORLD_SIZE"])
        if args.world_size not in (None, world):
            raise ValueError(f"--world-size {args.world_size} disagrees with torchrun's WORLD_SIZE={world}")
        return world
    world = 2 if args.world_size is None else args.world_size
    if world < 1:
        raise ValueError(f"--world-size must be >= 1, got {world}")
    return world


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
    from zen.launch import spawn

    def launch(**where: Any) -> dict[str, Any]:
        return spawn("workloads.train:rank_main", cfg.world_size, {"config": asdict(cfg)}, backend=cfg.backend,
                     timeout_s=float(os.environ.get("ZEN_TRAIN_TIMEOUT_S", 3600)), **where)[0]

    if not cfg.bandwidth:
        return launch()
    from zen.netem import emulated_cluster

    with emulated_cluster(cfg.world_size, cfg.bandwidth) as cluster:
        return launch(**cluster.spawn_kwargs())


def print_table(report: dict[str, Any]) -> None:
    cfg = report["config"]
    print(f"{cfg['workload']} ({cfg['preset']}), {cfg['world_size']} x {cfg['backend']}, "
          f"{cfg['steps']} steps ({cfg['warmup']} warm-up)")
    print(f"{'scheme':>10} {'iter ms':>9} {'hook ms':>9} {'compute ms':>10} {'samples/s':>10} "
          f"{'MB recv/step':>12} {'emb MB':>8} {'final loss':>11}")
    for run in report["runs"]:
        s = run["summary"]
        print(f"{run['scheme']:>10} {s['iter_s_median'] * 1e3:9.2f} {_ms(s['hook_s_median']):>9} "
              f"{_ms(s.get('compute_s_median')):>10} {s['samples_per_s']:10.1f} "
              f"{_mb(s['bytes_received_per_step']):>12} {_mb(s['embedding_bytes_received_per_step']):>8} "
              f"{s['final_loss']:11.6f}")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def _mb(nbytes: float | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 1e6:.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workloads.train", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
