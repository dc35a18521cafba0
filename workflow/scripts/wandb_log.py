"""Log `zen bench` results to wandb: one run per benchmark cell, all grouped under the pipeline run.

`zen train` logs itself; the microbenchmark CLI writes JSON lines only, so this step replays them.
Usage: python workflow/scripts/wandb_log.py --group NAME --project zen --mode offline --dir results/wandb \
           --out results/wandb/bench_runs.json FILE.jsonl...
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from common import read_jsonl

from harness.provenance import write_json


def cell_name(rows: list[dict]) -> str:
    r = rows[0]
    pulls = {o.get("pull") for o in r["config"].get("options", {}).values()} - {None}
    pull = f"-pull_{'_'.join(sorted(pulls))}" if pulls else ""
    return f"bench-{r['backend']}-{r['pattern']}-n{r['world_size']}-d{r['density']:g}{pull}"


def log_file(path: str, args: argparse.Namespace) -> dict:
    import wandb

    rows = read_jsonl([path])
    if not rows:
        return {"file": path, "run": None}
    config = dict(rows[0]["config"], schemes=[r["scheme"] for r in rows], source=path)
    run = wandb.init(project=args.project, group=args.group, name=cell_name(rows), job_type="bench",
                     mode=args.mode, dir=args.dir, config=config, reinit="finish_previous")
    columns = ["scheme", "time_ms_median", "time_ms_p99", "bytes_received_max", "speedup_vs_allreduce", "correct"]
    run.log({"schemes": wandb.Table(columns=columns, data=[[r.get(c) for c in columns] for r in rows])})
    for r in rows:
        for key in columns[1:]:
            run.summary[f"{r['scheme']}/{key}"] = r.get(key)
    run_id = run.id
    run.finish()
    return {"file": path, "run": run_id, "name": cell_name(rows)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--group", required=True)
    parser.add_argument("--project", default="zen")
    parser.add_argument("--mode", default="offline", choices=("offline", "online", "disabled"))
    parser.add_argument("--dir", required=True, help="wandb writes its run folders under DIR/wandb")
    parser.add_argument("--out", required=True, help="JSON manifest of the logged runs")
    parser.add_argument("inputs", nargs="+")
    args = parser.parse_args(argv)
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("WANDB_SILENT", "true")
    runs = [log_file(p, args) for p in args.inputs]
    write_json(args.out, {"group": args.group, "project": args.project, "mode": args.mode, "dir": args.dir,
                          "runs": runs}, indent=2)
    print(f"{len(runs)} wandb runs ({args.mode}) in group {args.group}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
