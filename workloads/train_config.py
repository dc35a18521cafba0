"""The resolved configuration of one `zen train` launch (what every rank runs and the report records)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
    bucket_view: bool = True  # DDP's gradient_as_bucket_view: grads live in the buckets (no copy, less memory)
    check_every: int = 100  # the hook's cross-rank input check on steps 1-2, then every k-th; 0 no more
    compress: str | None = None  # zen.compress compressor for the sparse schemes' dense parts
    density: float = 0.05
    compress_options: dict[str, Any] = field(default_factory=dict)
    asynchronous: bool = True  # the hook overlaps communication with backward
    lanes: int = 2  # the hook's communication lanes (buckets in flight at once)
    interleave: bool = True  # one step of every scheme in turn (else one scheme after the other)
    log_every: int = 0  # progress line every k steps on rank 0; 0: about ten lines per run
    find_unused_parameters: bool = False
    backend: str = "gloo"
    out: str = ""
    wandb_mode: str = "offline"
    wandb_project: str = "zen"
    wandb_group: str = ""
    plugins: list[str] = field(default_factory=list)
    bandwidth: str | None = None  # emulated per-node link rate (harness/netem.py); None = loopback
    fsdp: bool = False  # shard the model with FSDP2 (workloads/fsdp_mode.py) instead of DDP
    torchrec: str | None = None  # shard the embedding collections with torchrec's DMP: "dp" | "mixed"; None = DDP
