"""Flatten JSON-lines results of the `zen` CLIs into one CSV per stage.

Usage: python workflow/scripts/aggregate.py bench --out results/aggregate/microbench.csv FILE.jsonl...
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import pandas as pd
from common import read_jsonl, write_csv

DROP = ("times_ms", "config", "phases_received_max")


def bench_row(row: dict[str, Any]) -> dict[str, Any]:
    """One `zen bench` row as flat columns: scalars kept, per-phase bytes as rx_<phase>, pull encoding."""
    flat = {k: v for k, v in row.items() if k not in DROP}
    for phase, nbytes in (row.get("phases_received_max") or {}).items():
        flat[f"rx_{phase}"] = nbytes
    options = (row.get("config") or {}).get("options") or {}
    flat["pull"] = (options.get(row["scheme"]) or {}).get("pull")
    flat["bandwidth"] = None if row.get("backend") == "sim" else (row.get("bandwidth") or "loopback")
    times = row.get("times_ms") or []
    flat["repeats"] = len(times)
    flat["times_ms"] = json.dumps([round(t, 4) for t in times])
    return flat


def bench_frame(paths: list[str]) -> pd.DataFrame:
    frame = pd.DataFrame([bench_row(r) for r in read_jsonl(paths)])
    keys = [c for c in ("backend", "pattern", "density", "world_size", "numel", "pull") if c in frame]
    return frame.sort_values(keys, kind="stable").reset_index(drop=True) if len(frame) else frame


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=("bench",))
    parser.add_argument("--out", required=True)
    parser.add_argument("inputs", nargs="+")
    args = parser.parse_args(argv)
    frame = bench_frame(args.inputs)
    write_csv(frame, args.out)
    print(f"{len(frame)} rows from {len(args.inputs)} files -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
