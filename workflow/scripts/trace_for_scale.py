"""Turn a `zen profile` trace (traces.pt) into the replay format of `zen scale --trace`.

`zen scale --trace` reads a traces.pt too; this stage keeps the pipeline's converted sets as a small
file of their own (harness.bench.scale.replay_sets: one set per worker in one row space, one step).
Usage: python workflow/scripts/trace_for_scale.py results/profile/lstm/traces.pt OUT.pt [--step -1]
"""

from __future__ import annotations

import argparse

import torch

from harness.bench.scale import replay_sets
from harness.provenance import atomic_file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("out")
    parser.add_argument("--step", type=int, default=-1)
    args = parser.parse_args(argv)
    data = replay_sets(torch.load(args.trace, weights_only=True), args.step)
    with atomic_file(args.out) as tmp:
        torch.save(data, tmp)
    print(f"{len(data['sets'])} workers, {data['rows']} rows -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
