"""`zen train`'s command line: its arguments, checked and resolved into a TrainConfig before any process starts
(workloads/train.py runs it); `zen profile` shares the compressor's arguments."""

from __future__ import annotations

import argparse
import ast
import importlib
import os
import sys
from pathlib import Path
from typing import Any

import torch

import zen
import zen.compress
from workloads.base import PRESETS, workload_names
from workloads.torch_hooks import EXAMPLES, is_torch_hook
from workloads.train_config import TrainConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", required=True, help="one of the registered workloads")
    parser.add_argument("--preset", default="tiny", help=f"one of {', '.join(PRESETS)}")
    parser.add_argument("--scheme", default="zen",
                        help=f"scheme(s), comma-separated: registered schemes or PyTorch's own hooks "
                             f"({', '.join(EXAMPLES)}; powersgd-R for any rank R)")
    add_compress_arguments(parser, "compressor for the sparse schemes' dense parts")
    parser.add_argument("--world-size", type=int, default=None,
                        help="ranks to spawn (default 2); under torchrun taken from WORLD_SIZE")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=None,
                        help="steps left out of the throughput (default min(3, steps // 2))")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bucket-cap-mb", type=float, default=None, help="DDP bucket size (default 25)")
    parser.add_argument("--no-bucket-view", action="store_true",
                        help="DDP copies gradients into its buckets (gradient_as_bucket_view=False)")
    parser.add_argument("--check-every", type=int, default=100, metavar="K",
                        help="the hook's cross-rank input check (one small all-gather per bucket) on the first "
                             "two steps, then every K-th; 0: no more (default 100)")
    parser.add_argument("--sync-hook", action="store_true",
                        help="synchronize each bucket inside the hook call (no overlap with backward; for A/B)")
    parser.add_argument("--lanes", type=int, default=2, help="the hook's communication lanes (default 2)")
    parser.add_argument("--no-interleave", action="store_true",
                        help="train the schemes one after the other (one model in memory) instead of a step "
                             "of each in turn")
    parser.add_argument("--log-every", type=int, default=0, metavar="K",
                        help="print progress every K steps (default: about ten lines)")
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
    parser.add_argument("--torchrec", choices=("dp", "mixed"), default=None,
                        help="shard the workload's torchrec embedding collections with DistributedModelParallel: dp, "
                             "every table data-parallel; mixed, the largest table-wise, the rest data-parallel "
                             "(schemes: Zen's, torchrec, torchrec-fp16, none)")
    parser.add_argument("--fsdp", action="store_true",
                        help="shard the model with FSDP2 (schemes: zen, zen-delta, dense: zen.fsdp; fsdp, fsdp-bf16)")
    parser.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                        help="import MODULE on every rank first (registers extra workloads/schemes)")


def resolve(args: argparse.Namespace, torchrun: bool) -> TrainConfig:
    """Check names and numbers before any process starts; ValueError says what is wrong."""
    import_plugins(args.plugin)
    names = workload_names()
    if args.workload not in names:
        raise ValueError(f"unknown workload {args.workload!r}; choose one of: {', '.join(names)}")
    if args.preset not in PRESETS:
        raise ValueError(f"unknown preset {args.preset!r}; choose one of: {', '.join(PRESETS)}")
    schemes = _schemes(args)
    options = parse_compress_options(args)
    world = _world_size(args, torchrun)
    warmup = min(3, args.steps // 2) if args.warmup is None else args.warmup
    if args.steps <= warmup or warmup < 0:
        raise ValueError(f"--steps ({args.steps}) must exceed --warmup ({warmup}) >= 0")
    if args.check_every < 0 or args.log_every < 0 or args.lanes < 1:
        raise ValueError("--check-every and --log-every must be >= 0, --lanes >= 1")
    if "bf16" in schemes and not (torchrun and torch.cuda.is_available()):
        raise ValueError("scheme bf16: DDP's bf16 hook needs NCCL on CUDA; on gloo use fp16")
    if args.bandwidth and torchrun:
        raise ValueError("--bandwidth emulates a cluster on one machine; under torchrun the network is real")
    if args.bandwidth:
        from harness.netem import parse_rate

        parse_rate(args.bandwidth)
    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torchrun and torch.cuda.is_available() else "gloo"
    mode = f"-torchrec_{args.torchrec}" if args.torchrec else "-fsdp" if args.fsdp else ""
    run_name = f"{args.workload}-{args.preset}{mode}-{'+'.join(schemes)}-P{world}"
    return TrainConfig(
        workload=args.workload, preset=args.preset, schemes=schemes, world_size=world, steps=args.steps,
        warmup=warmup, seed=args.seed, bucket_cap_mb=args.bucket_cap_mb, bucket_view=not args.no_bucket_view,
        check_every=args.check_every, compress=args.compress, density=args.density, compress_options=options,
        asynchronous=not args.sync_hook, lanes=args.lanes, interleave=not args.no_interleave, log_every=args.log_every,
        find_unused_parameters=args.find_unused_parameters, backend=backend,
        out=str(Path(args.out or Path("results", "train", f"{run_name}.json")).resolve()),
        wandb_mode=args.wandb_mode or os.environ.get("WANDB_MODE") or "offline",
        wandb_project=args.wandb_project,
        wandb_group=args.wandb_group or f"{args.workload}-{args.preset}-P{world}", plugins=list(args.plugin),
        bandwidth=args.bandwidth, torchrec=args.torchrec, fsdp=args.fsdp)


def _schemes(args: argparse.Namespace) -> list[str]:
    """The --scheme names, each one this mode runs: PyTorch's hooks under DDP, torchrec's wrapping under DMP."""
    schemes = [s.strip() for s in args.scheme.split(",") if s.strip()]
    if args.fsdp:
        from workloads.fsdp_mode import is_scheme
        from workloads.fsdp_mode import schemes as fsdp_schemes

        if args.torchrec:
            raise ValueError("--fsdp and --torchrec are two ways to shard a model: choose one")
        if [s for s in schemes if not is_scheme(s)] or not schemes:
            raise ValueError(f"--fsdp runs the schemes {', '.join(fsdp_schemes())}; got {args.scheme!r}")
        return schemes
    if args.torchrec:
        from workloads.torchrec_mode import BASELINES, is_scheme

        bad = [s for s in schemes if not is_scheme(s)]
        if bad or not schemes:
            raise ValueError(f"unknown scheme {', '.join(bad) or repr(args.scheme)} with --torchrec; choose from: "
                             f"{', '.join([*zen.schemes(), *BASELINES])}")
        if args.sync_hook or args.lanes != 2:
            raise ValueError("--sync-hook and --lanes do not apply with --torchrec (its hooks share one group and "
                             "synchronize inside the hook call)")
        return schemes
    bad = [s for s in schemes if s not in zen.schemes() and not is_torch_hook(s)]
    if bad or not schemes:
        raise ValueError(f"unknown scheme {', '.join(bad) or repr(args.scheme)}; "
                         f"choose from: {', '.join([*zen.schemes(), *EXAMPLES])} (powersgd-R for any rank R >= 1)")
    return schemes


def add_compress_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """--compress, --density and --compress-option (`zen train`, `zen profile`)."""
    parser.add_argument("--compress", default=None,
                        help=f"{what} (zen.compress: {', '.join(zen.compress.compressors())})")
    parser.add_argument("--density", type=float, default=0.05, help="share of elements the compressor keeps")
    parser.add_argument("--compress-option", action="append", default=[], metavar="KEY=VALUE",
                        help="a compressor option, e.g. warmup_steps=5 (repeatable; dgc: momentum=0 unless set)")


def parse_compress_options(args: argparse.Namespace) -> dict[str, Any]:
    """--compress-option KEY=VALUE pairs (values as Python literals), checked by building the compressor."""
    options: dict[str, Any] = {}
    for item in args.compress_option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--compress-option wants KEY=VALUE, got {item!r}")
        try:
            options[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            options[key] = value
    if args.compress is None and options:
        raise ValueError("--compress-option needs --compress")
    if args.compress is not None:
        zen.compress.make_compressor(args.compress, args.density, **options)
    return options


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


def with_defaults(compress: str | None, options: dict[str, Any]) -> dict[str, Any]:
    """A compressor's options as the workloads use it: DGC's momentum correction replaces the optimizer's
    momentum, and the workloads train with plain SGD, so it is off unless asked for."""
    defaults = {"momentum": 0.0} if compress == "dgc" else {}
    return {**defaults, **options}


def import_plugins(modules: list[str]) -> None:
    """Modules that register extra workloads or schemes (e.g. a test's toy workload), looked up from
    the current directory too, as `python -m` would."""
    if modules and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    for module in modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            raise ValueError(f"--plugin {module}: {exc}") from exc
