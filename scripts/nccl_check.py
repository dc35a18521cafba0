#!/usr/bin/env python
"""Zen under real NCCL, on one machine with >= 2 GPUs: one command, a table at the end.

Spawns one rank per GPU (harness.launch, backend nccl, cuda:LOCAL_RANK each) and checks, on CUDA tensors:
every registered scheme lossless and alike on every rank; the DDP hook (dense and COO embeddings) against
DDP's own NCCL allreduce; host synchronizations per hook step by thread; two-level sync (2 ranks per node)
when there are >= 4 GPUs; and a killed rank: the survivors' next sync raises ZenCommError, none hangs.
Not run on the development machine (it has no GPU); the NCCL-rules test backend (tests/nccl_rules.py,
`pytest -m nccl_rules`) is how its rules are proven there.

    python scripts/nccl_check.py [--gpus N]

Exit status: 0 every check passed, 1 one failed, 2 fewer than 2 GPUs (or bad arguments).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

SCRIPTS = str(Path(__file__).resolve().parent)


def ranks(target: str, gpus: int, kwargs: dict | None = None, timeout_s: float = 600) -> list:
    from harness.launch import spawn

    return spawn(f"gpu_cases:{target}", gpus, kwargs or {}, backend="nccl", timeout_s=timeout_s,
                 env=lambda r: {"PYTHONPATH": SCRIPTS})


def check_schemes(gpus: int) -> str:
    import zen

    names = zen.schemes()
    reports = ranks("schemes_lossless", gpus, {"names": names})
    for name in names:
        assert all(r[name][0] for r in reports), f"{name}: wrong sum"
        assert len({r[name][1] for r in reports}) == 1, f"{name}: ranks differ"
    return f"{len(names)} schemes"


def check_hook(gpus: int) -> str:
    worst = 0.0
    for sparse in (False, True):
        got = ranks("hook_vs_ddp", gpus, {"sparse": sparse})
        ref, ours = got[0]["ddp"], got[0]["zen"]
        assert len({r["zen"]["checksum"] for r in got}) == 1, "parameters differ across ranks"
        diff = max(abs(a - b) for a, b in zip(ref["losses"], ours["losses"], strict=True))
        assert diff <= 1e-4 * max(1.0, abs(ref["losses"][0])), f"loss differs by {diff} (sparse={sparse})"
        worst = max(worst, diff)
    return f"largest loss difference {worst:.1e}"


def check_syncs(gpus: int) -> str:
    out = []
    for sparse in (False, True):
        got = ranks("syncs_per_step", gpus, {"sparse": sparse})[0]
        assert got.get("autograd", 0) == 0, f"host syncs on backward's thread: {got}"
        out.append(f"{'COO' if sparse else 'dense'}: lanes {got.get('lane', 0)} for {got['rounds']} rounds")
    return "; ".join(out)


def check_two_level(gpus: int) -> str:
    if gpus < 4 or gpus % 2:
        return "skipped (needs an even number >= 4 of GPUs)"
    got = ranks("two_level", gpus, {"ranks_per_node": 2})
    assert all(ok for ok, _ in got) and len({s for _, s in got}) == 1, got
    return "2 ranks per node"


def check_killed_rank(gpus: int) -> str:
    got = ranks("killed_rank", gpus, {"timeout_s": 20.0}, timeout_s=300)
    survivors = [m for r, m in enumerate(got) if r != 1]
    assert all(m.startswith("ZenCommError") for m in survivors), survivors
    return survivors[0][:60]


CHECKS: list[tuple[str, Callable[[int], str]]] = [
    ("every scheme lossless on CUDA tensors", check_schemes),
    ("DDP hook vs DDP's NCCL allreduce", check_hook),
    ("host synchronizations per hook step", check_syncs),
    ("two-level sync", check_two_level),
    ("a killed rank is a ZenCommError", check_killed_rank),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=None, help="ranks to run (default: every visible GPU)")
    args = parser.parse_args(argv)
    gpus = args.gpus or torch.cuda.device_count()
    if gpus < 2 or gpus > torch.cuda.device_count():
        print(f"nccl_check: needs >= 2 GPUs (asked {gpus}, {torch.cuda.device_count()} visible)", file=sys.stderr)
        return 2
    rows = []
    for name, fn in CHECKS:
        start = time.perf_counter()
        try:
            rows.append((name, "PASS", fn(gpus)))
        except Exception as exc:  # noqa: BLE001 - every check runs; the table says which failed
            traceback.print_exc()
            rows.append((name, "FAIL", f"{type(exc).__name__}: {str(exc)[:200]}"))
        print(f"{rows[-1][1]}  {name} ({time.perf_counter() - start:.0f} s)", flush=True)
    print(f"\n# nccl_check: {gpus} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}")
    print("| check | result | detail |\n|---|---|---|")
    for name, status, detail in rows:
        print(f"| {name} | {status} | {detail} |")
    return 0 if all(status == "PASS" for _, status, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
