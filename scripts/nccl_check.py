#!/usr/bin/env python
"""Zen under real NCCL, on one machine with >= 2 GPUs: one command, a table at the end.

Spawns one rank per GPU (harness.launch, backend nccl, cuda:LOCAL_RANK each) and checks, on CUDA tensors:
every registered scheme lossless and alike on every rank; the DDP hook (dense and COO embeddings) against
DDP's own NCCL allreduce; no host synchronization inside the hook's calls on backward's thread (negative
control: one injected host read); DDP reading bucket results only after the lane's stream wrote them (negative
control: a Future without the stream dependency); two-level sync (2 ranks per node) when there are >= 4 GPUs;
and a killed rank: the survivors' next sync raises ZenCommError, none hangs. The checks, their controls and
the table are scripts/gpu_check.py's (harness.gpucheck).
Not run on the development machine (it has no GPU); the NCCL-rules test backend (tests/nccl_rules.py,
`pytest -m nccl_rules`) is how its rules are proven there.

    python scripts/nccl_check.py [--gpus N]

Exit status: 0 every check passed, 1 one failed, 2 fewer than 2 GPUs (or bad arguments).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the harness runs from a checkout

from harness.gpucheck.syncs import judge_syncs  # noqa: E402
from harness.gpucheck.table import Once, Row, exit_status, render, require, run_row, skipped  # noqa: E402
from harness.gpucheck.verdicts import judge_hook, judge_race  # noqa: E402

SCRIPTS = str(Path(__file__).resolve().parent)


def ranks(target: str, gpus: int, kwargs: dict | None = None, timeout_s: float = 600) -> list:
    from harness.launch import spawn

    return spawn(f"gpu_cases:{target}", gpus, kwargs or {}, backend="nccl", timeout_s=timeout_s,
                 env=lambda r: {"PYTHONPATH": f"{SCRIPTS}:{ROOT}"})


def check_schemes(gpus: int) -> str:
    import zen

    names = zen.schemes()
    reports = ranks("schemes_lossless", gpus, {"names": names})
    for name in names:
        require(all(r[name][0] for r in reports), f"{name}: wrong sum")
        require(len({r[name][1] for r in reports}) == 1, f"{name}: ranks differ")
    return f"{len(names)} schemes"


def check_two_level(gpus: int) -> str:
    got = ranks("two_level", gpus, {"ranks_per_node": 2})
    require(all(ok for ok, _ in got) and len({s for _, s in got}) == 1, str(got))
    return "2 ranks per node"


def check_killed_rank(gpus: int) -> str:
    got = ranks("killed_rank", gpus, {"timeout_s": 20.0}, timeout_s=300)
    survivors = [m for r, m in enumerate(got) if r != 1]
    require(all(m.startswith("ZenCommError") for m in survivors), str(survivors))
    return survivors[0][:60]


def rows_of(gpus: int) -> list[Row]:
    hook = Once(lambda: ranks("hook_vs_ddp", gpus))
    syncs = Once(lambda: ranks("syncs_per_step", gpus, {"cases": [(False, False), (True, False), (False, True)]})[0])
    race = Once(lambda: ranks("race", gpus)[0])
    checks: list[tuple[str, Callable[[], str], Callable[[], str] | None]] = [
        ("every scheme lossless on CUDA tensors", lambda: check_schemes(gpus), None),
        ("DDP hook vs DDP's NCCL allreduce", lambda: judge_hook(hook()), None),
        ("no host sync in hook calls on backward's thread (dense; COO)",
         lambda: "; ".join(judge_syncs(c) for c in syncs()[:2]), lambda: judge_syncs(syncs()[2])),
        ("DDP reads bucket results only after the lane's stream wrote them",
         lambda: judge_race(race()["check"]), lambda: judge_race(race()["control"])),
        ("two-level sync", lambda: check_two_level(gpus), None),
        ("a killed rank is a ZenCommError", lambda: check_killed_rank(gpus), None),
    ]
    rows = []
    for name, check, control in checks:
        if name == "two-level sync" and (gpus < 4 or gpus % 2):
            rows.append(skipped(name, "needs an even number >= 4 of GPUs"))
            continue
        rows.append(run_row(name, check, control))
        print(f"{rows[-1].status}  {name} ({rows[-1].seconds:.0f} s)", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=None, help="ranks to run (default: every visible GPU)")
    args = parser.parse_args(argv)
    gpus = args.gpus or torch.cuda.device_count()
    if gpus < 2 or gpus > torch.cuda.device_count():
        print(f"nccl_check: needs >= 2 GPUs (asked {gpus}, {torch.cuda.device_count()} visible)", file=sys.stderr)
        return 2
    rows = rows_of(gpus)
    print(f"\n# nccl_check: {gpus} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}")
    print(render(rows))
    return exit_status(rows)


if __name__ == "__main__":
    sys.exit(main())
