"""Turn a `zen profile` trace (traces.pt) into the replay format of `zen scale --trace`.

`zen profile` stores row ids per step, worker and sparse parameter; `zen scale` wants one set per worker
in a single row space: {"rows": M, "sets": [int64 row ids of worker 0, ...]}. Parameters are stacked in
order (as workloads/profile.py does for its statistics) and one step is taken (the last by default:
the model has trained a little, as in the paper's measurements).
Usage: python workflow/scripts/trace_for_scale.py results/profile/lstm/traces.pt OUT.pt [--step -1]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch


def convert(trace: dict, step: int) -> dict:
    rows = [int(p["rows"]) for p in trace["params"]]
    offsets = [sum(rows[:k]) for k in range(len(rows))]
    workers = trace["indices"][step]
    sets = [torch.cat([ids.long() + off for ids, off in zip(per_param, offsets, strict=True)]).unique()
            for per_param in workers]
    return {"rows": sum(rows), "sets": sets}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("out")
    parser.add_argument("--step", type=int, default=-1)
    args = parser.parse_args(argv)
    data = convert(torch.load(args.trace, weights_only=True), args.step)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    torch.save(data, tmp)
    tmp.replace(out)
    print(f"{len(data['sets'])} workers, {data['rows']} rows -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
