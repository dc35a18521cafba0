"""Where a rank's time goes in one steady-state call, per stage, for the loopback benchmark's schemes.

py-spy samples every rank of `zen bench --backend gloo` (native frames included) twice: with `--short`
and with `--long` timed calls after the same warm-up. The difference between the two recordings is what
`long - short` steady-state calls cost, so the first calls' one-time work (the extension's load, S_j's
construction, the seed) drops out. Each sample of a rank inside a sync call is charged to the innermost
frame that names a stage (STAGES, first match from the innermost frame outwards); the rest is "other".
Printed per scheme: milliseconds of samples per rank and call in each stage, and each stage's share. py-spy
samples a rank's stack whether it runs or waits for a core (4 ranks share 2 here), so a row adds up to about
the call's wall time, not its CPU time; a rank waiting for a peer counts in "wire".

    python scripts/profile_local_work.py [--schemes zen-bp,zen-hc] [--numel 16777216] [--density 0.01]
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

RATE = 50  # samples per second per process: py-spy falls behind at higher rates with 4 ranks on 2 cores
STAGES = [  # (stage, frame-name pattern); the innermost matching frame decides
    ("check", r"check_parts|local_summary"),
    ("extract", r"nonzero_rows|nonzero_flat|extract_rows"),
    ("output", r"fill_sum|fill_blocks|DenseOutput\.|stream_block|write_shards|fill_hash_bitmap|pull_words"),
    ("decode", r"decode"),
    ("encode", r"encode|set_bits|bitmap_chunk"),
    ("aggregate", r"merge_rows|union_rows|add_messages|compact_sum|aggregate|index_add"),
    ("hash", r"hash|partition|ServerRanks|server_ranks|split_"),
    ("wire", r"Communicator\.|DistComm\.|gloo|writev|readv|recv|send|_wait"),
]
ORDER = [s for s, _ in STAGES] + ["other"]


def stage_of(frames: list[str]) -> str:
    for frame in reversed(frames):
        for stage, pattern in STAGES:
            if re.search(pattern, frame):
                return stage
    return "other"


def spy() -> str:
    """py-spy beside this interpreter (the venv's, from requirements-dev.txt), else on PATH."""
    local = Path(sys.executable).with_name("py-spy")
    return str(local) if local.exists() else shutil.which("py-spy") or "py-spy"


def record(scheme: str, repeats: int, args: argparse.Namespace, out: Path) -> None:
    zen = Path(sys.executable).with_name("zen")
    cmd = [spy(), "record", "--native", "--subprocesses", "--rate", str(RATE), "--format", "raw", "-o", str(out),
           "--", str(zen), "bench", "--backend", "gloo", "-n", str(args.world_size), "--numel", str(args.numel),
           "--density", str(args.density), "--pattern", "random", "--schemes", scheme, "--repeats", str(repeats),
           "--warmup", "4"]
    for _attempt in range(3):  # py-spy's native unwinding crashes now and then (SIGSEGV): sample again
        if subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
            return
    raise RuntimeError(f"py-spy failed three times on {scheme}")


def stage_samples(path: Path) -> collections.Counter[str]:
    """Samples per stage inside sync calls (the benchmark worker's `sync` frame and below)."""
    counts: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = [re.sub(r" \(.*", "", f) for f in stack.split(";")]
        if "dist_worker" not in frames:
            continue
        below = frames[frames.index("dist_worker") + 1 :]
        if below and below[0] == "sync":
            counts[stage_of(below)] += int(n)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schemes", default="zen-bp,zen-hc")
    parser.add_argument("--numel", type=int, default=1 << 24)
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--world-size", "-n", type=int, default=4)
    parser.add_argument("--short", type=int, default=5)
    parser.add_argument("--long", type=int, default=45)
    args = parser.parse_args(argv)
    if shutil.which(spy()) is None:
        parser.error("py-spy is not installed (make setup installs it: requirements-dev.txt)")
    if not 0 < args.short < args.long:
        parser.error("need 0 < --short < --long")
    calls = args.long - args.short
    per_call_rank = 1e3 / RATE / calls / args.world_size  # ms per sample, per call and rank
    print(f"# {args.world_size} gloo ranks, loopback, numel {args.numel}, density {args.density}: "
          f"ms per rank and call by stage ({calls} steady-state calls, py-spy at {RATE} Hz)")
    print(f"{'scheme':>8} " + " ".join(f"{s:>9}" for s in ORDER) + f" {'total':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for scheme in args.schemes.split(","):
            got = []
            for repeats in (args.short, args.long):
                path = Path(tmp, f"{scheme}-{repeats}.txt")
                record(scheme, repeats, args, path)
                got.append(stage_samples(path))
            ms = {s: max(0, got[1][s] - got[0][s]) * per_call_rank for s in ORDER}
            total = sum(ms.values())
            print(f"{scheme:>8} " + " ".join(f"{ms[s]:9.2f}" for s in ORDER) + f" {total:8.2f}")
            print(f"{'':>8} " + " ".join(f"{100 * ms[s] / total:8.0f}%" for s in ORDER))
    return 0


if __name__ == "__main__":
    sys.exit(main())
