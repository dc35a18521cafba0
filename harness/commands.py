"""The harness's `zen` subcommands, registered in pyproject.toml's `zen.commands` entry points: light objects
(the modules they name are imported only when their command runs)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    module: str
    help: str

    def prepare(self) -> None:
        """A pipeline job (ZEN_PIPELINE_PID, set by workflow/rules/common.smk) goes when the pipeline goes."""
        if os.environ.get("ZEN_PIPELINE_PID", "").isdigit():
            from harness.launch import exit_with

            exit_with(int(os.environ["ZEN_PIPELINE_PID"]))


bench = Command("harness.bench.cli", "microbenchmark schemes (sim, gloo, nccl) in the spirit of nccl-tests")
model = Command("harness.model_cli", "predict bytes and time of every scheme with the cost model")
scale = Command("harness.bench.scale", "simulate world sizes 2..128 for every scheme (paper Figure 8 data)")
cluster = Command("harness.bench.cluster", "model a profiled workload's step on a cluster, e.g. 16 x 8 GPUs (Fig 15)")
profile = Command("workloads.profile", "record embedding-gradient sparsity of a workload")
train = Command("workloads.train", "distributed training of a workload with any scheme")
