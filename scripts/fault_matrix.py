"""Fault-injection matrix on real gloo ranks: every fault class of tests/fault_cases.py, several schemes,
repeated; one table of runs, survivors that raised, hung runs, wrong results and leaked processes.

Usage: python scripts/fault_matrix.py [--repeats 2] [--schemes allreduce,zen,agsparse,sparcml]
A run counts as hung when its launch overruns; as wrong when a rank returned a wrong sum (the rank bodies
raise on one, so the launch fails); leaked: harness.launch processes left once the launch has returned.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.launch import spawn  # noqa: E402
from zen.types import ZenCommError  # noqa: E402

P = 3


def _launch_processes() -> int:
    count = 0
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and b"harness.launch" in (entry / "cmdline").read_bytes():
                count += 1
        except OSError:
            continue
    return count


def classes(schemes: list[str]) -> list[tuple[str, str, dict, list[int]]]:
    """(fault class, target, kwargs, the ranks that must raise)."""
    out = []
    for scheme in schemes:
        for kind in ("before", "during", "after", "frozen"):
            out.append((f"peer {kind}", "tests.fault_cases:peer_fault",
                        {"kind": kind, "scheme": scheme, "timeout_s": 3.0}, [0, 2]))
        out.append(("late peer, retried", "tests.fault_cases:late_peer",
                    {"scheme": scheme, "timeout_s": 3.0, "late_s": 6.0}, [0, 1, 2]))
        out.append(("skipped call (tag)", "tests.fault_cases:skipped_call", {"scheme": scheme, "tagged": True},
                    [0, 1, 2]))
    for kind in ("options", "validate", "unknown_scheme", "bad_out", "leaf_out"):
        out.append((f"apart: {kind}", "tests.fault_cases:configured_apart", {"kind": kind}, [0, 1, 2]))
    for kind in ("shape", "dtype", "nan", "inf", "scheme_mismatch", "index"):
        out.append((f"bad input: {kind}", "tests.dist_cases:bad_input", {"kind": kind, "scheme": "zen"},
                    [0, 1, 2]))
    return out


def raised(result: object) -> bool:
    """Whether a rank's report says it raised: its last attempt for the bodies that try more than once,
    else its error message ("no error" / "ok" when it did not)."""
    if isinstance(result, dict):
        result = result["seen"]
    if isinstance(result, list):
        result = result[-1] if result else "ok"
    return str(result) not in ("ok", "no error", "left")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--schemes", default="allreduce,zen,agsparse,sparcml")
    args = parser.parse_args()
    rows: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    start = time.monotonic()
    for _ in range(args.repeats):
        for name, target, kwargs, must in classes(args.schemes.split(",")):
            row = rows[name]
            row["runs"] += 1
            try:
                out = spawn(target, P, kwargs, timeout_s=90)
            except ZenCommError as exc:
                hung = "still running" in str(exc)
                row["hung" if hung else "wrong or crashed"] += 1
                print(f"{name} {kwargs}: {str(exc)[:300]}", file=sys.stderr)
                continue
            row["survivors"] += len(must)
            row["raised"] += sum(raised(out[r]) for r in must)
            time.sleep(0.5)
            row["leaked"] += _launch_processes()
    print("| fault class | runs | survivors | raised | hung | wrong or crashed | leaked |")
    print("|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {row['runs']} | {row['survivors']} | {row['raised']} | {row['hung']} | "
              f"{row['wrong or crashed']} | {row['leaked']} |")
    print(f"# {sum(r['runs'] for r in rows.values())} runs in {time.monotonic() - start:.0f} s")
    return 0 if not any(r["hung"] or r["wrong or crashed"] or r["leaked"] for r in rows.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
