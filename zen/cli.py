"""`zen` command line: one subcommand per job, each living in the module that does the job.

Subcommand modules expose `add_arguments(parser)` and `run(args) -> int`; they are imported only
when used, so a heavy dependency of one job never slows down another.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from zen.cli_args import UsageError

SUBCOMMANDS = {
    "schemes": ("zen.cli_schemes", "list the registered synchronization schemes"),
    "bench": ("zen.bench.cli", "microbenchmark schemes (sim, gloo, nccl) in the spirit of nccl-tests"),
    "model": ("zen.costmodel_cli", "predict bytes and time of every scheme with the cost model"),
    "scale": ("zen.bench.scale", "simulate world sizes 2..128 for every scheme (paper Figure 8 data)"),
    "cluster": ("zen.bench.cluster", "model a profiled workload's step on a cluster, e.g. 16 x 8 GPUs (Fig 15)"),
    "build": ("zen.native.build", "build the native C++ (and CUDA) kernels"),
    "kernels-bench": ("zen.native.bench", "hashing + encoding throughput of the native kernels"),
    "profile": ("workloads.profile", "record embedding-gradient sparsity of a workload"),
    "train": ("workloads.train", "distributed training of a workload with any scheme"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="zen", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in SUBCOMMANDS:
        parser.parse_args(argv or ["--help"])
        return 2
    if os.environ.get("ZEN_PIPELINE_PID", "").isdigit():  # a pipeline job: go when the pipeline goes
        from zen.launch import exit_with

        exit_with(int(os.environ["ZEN_PIPELINE_PID"]))
    module_name, help_text = SUBCOMMANDS[argv[0]]
    module = importlib.import_module(module_name)
    cmd = argparse.ArgumentParser(prog=f"zen {argv[0]}", description=help_text,
                                  formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    module.add_arguments(cmd)
    args = cmd.parse_args(argv[1:])
    try:
        return int(module.run(args) or 0)
    except UsageError as exc:
        print(f"zen {argv[0]}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
