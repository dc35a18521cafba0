"""`python -m simulator`: the step simulator's command line (bad arguments: one line, exit 2).

  timeline   this machine's compute timeline of a workload (one thread, DDP's buckets)
  calibrate  this machine's cost of a message on the emulated cluster
  blockcost  this machine's cost of OmniReduce's aggregator work per block
  mergecost  this machine's cost of SparCML's merge of two streams (per row and value)
  fidelity   one emulated-cluster cell simulated, beside what `zen train` measured there
  paper      the paper's cluster (and larger) simulated from a paper-density trace
  fig8       Fig 8 with latency and contention: each scheme's embedding sync on a flat cluster
  llm        Figs 13/14: an LLM with DGC top-5%, tensor parallel in a machine, from a DGC trace
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from zen.cli_args import UsageError, positive_int, world_sizes


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints the usage too)
        raise UsageError(message)


def _rate(text: str) -> float:
    from harness.netem import parse_rate

    try:
        return parse_rate(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_paper(sub: argparse._SubParsersAction) -> None:
    pp = sub.add_parser("paper", help="the paper's cluster simulated from a paper-density trace")
    pp.add_argument("--profile", type=Path, required=True, help="a `zen profile --preset table1 --out` folder")
    pp.add_argument("--workload", required=True, choices=["lstm", "dlrm", "gpt2", "bert"])
    pp.add_argument("--nodes", type=world_sizes, default=[16])
    pp.add_argument("--gpus-per-node", type=positive_int, default=8)
    pp.add_argument("--bandwidth", type=_rate, action="append", help="NIC rate (repeatable; default 25gbit)")
    pp.add_argument("--schemes", default="allreduce,agsparse,sparcml,omnireduce,sparse_ps,zen")
    pp.add_argument("--jobs", type=positive_int, default=1, help="simulations at once (each one core)")
    pp.add_argument("--per", choices=["gpu", "machine"], default="gpu",
                    help="gpu: every GPU its own flows; machine: a machine's GPUs as one endpoint (1/8 of the "
                         "flows: how 1,024 GPUs fit here; docs/simulator.md)")
    pp.add_argument("--compute-scale", type=float, action="append",
                    help="the roofline's compute times this (repeatable; default 1): Fig 11's sensitivity to it")
    pp.add_argument("--block-cost", type=Path, help="`python -m simulator blockcost --out`: OmniReduce's "
                    "aggregator work per block, priced (default: left out)")
    pp.add_argument("--merge-cost", type=Path, help="`python -m simulator mergecost --out`: SparCML's merge per "
                    "round, priced (default: left out)")
    pp.add_argument("--csv", type=Path, required=True)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m simulator", description="a step simulator on SimGrid (issue 30)")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    t = sub.add_parser("timeline", help="this machine's compute timeline of a workload")
    t.add_argument("--workload", required=True)
    t.add_argument("--preset", default="scaled")
    t.add_argument("--steps", type=positive_int, default=8)
    t.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("calibrate", help="this machine's cost of a message on the emulated cluster")
    c.add_argument("--bandwidth", default="1gbit")
    c.add_argument("--repeats", type=positive_int, default=20)
    c.add_argument("--out", type=Path, required=True)
    for name, what in (("blockcost", "OmniReduce's aggregator work per block"),
                       ("mergecost", "SparCML's merge of two streams, per row and value")):
        sub.add_parser(name, help=f"this machine's cost of {what}").add_argument("--out", type=Path, required=True)
    v = sub.add_parser("fidelity", help="one emulated-cluster cell simulated beside its measurement")
    v.add_argument("--measured", type=Path, nargs="+", required=True,
                   help="`zen train --out` JSONs of one workload and world size (one per link rate), or an "
                        "aggregated training CSV (fig11_throughput.csv) with --workload and --world-size")
    v.add_argument("--workload", help="the cell to take from a CSV")
    v.add_argument("--world-size", type=positive_int, help="the cell to take from a CSV")
    v.add_argument("--timeline", type=Path, required=True, help="`python -m simulator timeline --out`")
    v.add_argument("--cost", type=Path, required=True, help="`python -m simulator calibrate --out`")
    v.add_argument("--cores", type=positive_int, default=2)
    v.add_argument("--csv", type=Path, required=True)
    _add_paper(sub)
    f = sub.add_parser("fig8", help="Fig 8 with latency and contention, from a paper-density trace")
    f.add_argument("--profile", type=Path, required=True, help="a `zen profile --preset table1 --out` folder")
    f.add_argument("--workload", default="gpt2", choices=["lstm", "dlrm", "gpt2", "bert"])
    f.add_argument("--world-sizes", type=world_sizes, default=[2, 4, 8, 16, 32, 64, 128])
    f.add_argument("--bandwidth", type=_rate, default=25e9, help="NIC rate (default 25gbit)")
    f.add_argument("--latency-us", type=float, default=10.0, help="a message's latency end to end")
    f.add_argument("--unit", choices=["element", "row"], default="element",
                   help="an index per element (the paper's Fig 8) or per embedding row (the real system's)")
    f.add_argument("--schemes", default="allreduce,agsparse,sparcml,omnireduce,sparse_ps,zen-bp,zen-hc")
    f.add_argument("--csv", type=Path, required=True)
    lm = sub.add_parser("llm", help="Figs 13/14: an LLM with DGC top-5%%, from a `zen profile --compress` trace")
    lm.add_argument("--profile", type=Path, required=True, help="a `zen profile --compress dgc --out` folder")
    lm.add_argument("--model", default="opt-2.7b", help="opt-2.7b, llama3.2-3b or gemma2-2b")
    lm.add_argument("--nodes", type=world_sizes, default=[2, 4, 8, 16])
    lm.add_argument("--bandwidth", type=_rate, action="append", help="NIC rate (repeatable; default 25gbit)")
    lm.add_argument("--schemes", default="allreduce,agsparse,sparcml,omnireduce,zen")
    lm.add_argument("--jobs", type=positive_int, default=1, help="simulations at once (each one core)")
    lm.add_argument("--csv", type=Path, required=True)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if os.environ.get("ZEN_PIPELINE_PID", "").isdigit():  # a pipeline job goes when the pipeline goes
            from harness.launch import exit_with

            exit_with(int(os.environ["ZEN_PIPELINE_PID"]))
        return _run(args)
    except UsageError as exc:
        print(f"python -m simulator: error: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    commands = {"timeline": _timeline, "calibrate": _calibrate, "blockcost": _blockcost, "mergecost": _mergecost,
                "fidelity": _fidelity, "paper": _paper, "fig8": _fig8, "llm": _llm}
    if args.command not in commands:
        raise UsageError(f"unknown command {args.command}")
    commands[args.command](args)
    return 0


def _need_trace(profile: Path) -> None:
    if not (profile / "traces.pt").is_file():
        raise UsageError(f"--profile {profile}: no traces.pt there")


def _timeline(args: argparse.Namespace) -> None:
    from simulator import timeline

    t = timeline.measure(args.workload, args.preset, steps=args.steps)
    timeline.save(t, args.out)
    print(f"{args.workload}/{args.preset}: forward {1e3 * t.forward_s:.1f} ms, backward "
          f"{1e3 * t.backward_s:.1f} ms ({len(t.buckets)} buckets), optimizer {1e3 * t.optimizer_s:.1f} ms "
          "(one thread's CPU time)")


def _calibrate(args: argparse.Namespace) -> None:
    from simulator.calibrate import measure

    cost = measure(args.bandwidth, args.repeats)
    cost.save(args.out)
    print(cost)


def _blockcost(args: argparse.Namespace) -> None:
    from simulator.omnistream import measure

    block = measure()
    block.save(args.out)
    print(block)


def _mergecost(args: argparse.Namespace) -> None:
    from simulator.sparcmerge import measure

    merge = measure()
    merge.save(args.out)
    print(merge)


def _fidelity(args: argparse.Namespace) -> None:
    from harness.provenance import write_csv
    from simulator.compare import fidelity_rows, reports_from_throughput

    for path in (*args.measured, args.timeline, args.cost):
        if not path.is_file():
            raise UsageError(f"{path}: no such file")
    reports = []
    for path in args.measured:
        if path.suffix == ".csv":
            if not (args.workload and args.world_size):
                raise UsageError("a CSV of measurements needs --workload and --world-size")
            reports += reports_from_throughput(path, args.workload, args.world_size)
        else:
            reports.append(json.loads(path.read_text()))
    rows = fidelity_rows(reports, args.timeline, args.cost, args.cores)
    write_csv(args.csv, rows)
    for r in rows:
        print(f"{r['workload']:>5} n={r['world_size']} {r['bandwidth']:>8} {r['scheme']:>11}  measured "
              f"{r['measured_ms']:8.1f} ms  simulated {r['simulated_ms']:8.1f} ms  ({r['error']:+.1%})")


def _paper(args: argparse.Namespace) -> None:
    from harness.provenance import write_csv
    from simulator.omnistream import BlockCost
    from simulator.paper import table
    from simulator.sparcmerge import MergeCost

    _need_trace(args.profile)
    if any(c <= 0 for c in args.compute_scale or []):
        raise UsageError(f"--compute-scale must be positive, got {args.compute_scale}")
    for flag, path in (("--block-cost", args.block_cost), ("--merge-cost", args.merge_cost)):
        if path is not None and not path.is_file():
            raise UsageError(f"{flag} {path}: no such file")
    if args.merge_cost is not None and args.per != "gpu":
        raise UsageError("--merge-cost needs --per gpu (SparCML's merges run on each GPU's processor)")
    if "zen" not in args.schemes.split(","):
        raise UsageError(f"--schemes {args.schemes}: include zen (every row gives zen's speedup over its scheme)")
    cost = BlockCost.load(args.block_cost) if args.block_cost is not None else None
    merge = MergeCost.load(args.merge_cost) if args.merge_cost is not None else None
    rows = table(args.workload, args.profile, args.nodes, args.gpus_per_node, args.bandwidth or [25e9],
                 args.schemes.split(","), args.jobs, args.per, tuple(args.compute_scale or [1.0]), cost, merge)
    write_csv(args.csv, rows)
    for r in rows:
        print(f"{r['workload']:>5} {r['nodes']:>3}x{r['gpus_per_node']} {r['bandwidth_gbps']:>5g} Gbps "
              f"{r['scheme']:>11}  step {r['step_ms']:8.2f} ms  exposed comm {r['exposed_comm_ms']:8.2f} ms  "
              f"(model {r['model_comm_ms']:8.2f})  zen over it {r['zen_speedup']:.2f}x, "
              f"comm {r['zen_comm_speedup']:.2f}x")


def _fig8(args: argparse.Namespace) -> None:
    from harness.provenance import write_csv
    from simulator.fig8 import table

    _need_trace(args.profile)
    if min(args.world_sizes) < 2:
        raise UsageError("--world-sizes: Fig 8 needs at least 2 GPUs")
    if args.latency_us < 0:
        raise UsageError(f"--latency-us must be >= 0, got {args.latency_us}")
    write_csv(args.csv, table(args.profile / "traces.pt", args.world_sizes, args.bandwidth, args.schemes.split(","),
                              args.workload, 1e-6 * args.latency_us, args.unit))


def _llm(args: argparse.Namespace) -> None:
    from harness.provenance import write_csv
    from simulator.llm import MODELS, table

    _need_trace(args.profile)
    if args.model not in MODELS:
        raise UsageError(f"--model: unknown {args.model!r}; choose from {', '.join(MODELS)}")
    if min(args.nodes) < 2:
        raise UsageError("--nodes: data parallelism across machines needs at least 2")
    try:
        rows = table(args.profile, args.model, args.nodes, args.bandwidth or [25e9], args.schemes.split(","), args.jobs)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    write_csv(args.csv, rows)
    for r in rows:
        print(f"{r['paper_name']:>11} {r['nodes']:>3}x{r['gpus_per_node']} {r['bandwidth_gbps']:>5g} Gbps "
              f"{r['scheme']:>11}  step {r['step_ms']:9.1f} ms  exposed comm {r['exposed_comm_ms']:9.1f} ms  "
              f"zen over it {r['zen_speedup']:.2f}x, comm {r['zen_comm_speedup']:.2f}x")
