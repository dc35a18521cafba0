"""Flatten the JSON / CSV outputs of the `zen` CLIs into one tidy CSV per stage.

Usage: python workflow/scripts/aggregate.py KIND --out OUT.csv [extra outputs] INPUT...
KIND: bench (zen bench JSON lines), profile (zen profile folders), concat (CSVs with the same
columns, e.g. zen scale), kernels (zen kernels-bench JSON), train (zen train JSON).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pandas as pd
from common import read_jsonl, write_frame

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


def profile_frames(dirs: list[str], union_dirs: list[str] | None = None) -> dict[str, pd.DataFrame]:
    """Table 1 summary, gamma^n per n, pairwise overlaps and partition shares of every profiled workload;
    gamma^n and the union density from `union_dirs` (profiles of more workers) where given."""
    unions = {}
    for d in union_dirs or []:
        at_scale = json.loads(Path(d, "profile.json").read_text())
        unions[at_scale["workload"]] = at_scale["union"]
    summary, union, overlap, shares = [], [], [], []
    for d in dirs:
        s = json.loads(Path(d, "profile.json").read_text())
        w = s["workload"]
        u = unions.get(w, s["union"])
        summary.append({
            "workload": w, "preset": s["preset"], "workers": s["workers"], "steps": s["steps"],
            "embedding_rows": s["num_rows"], "local_batch_size": s.get("local_batch_size"),
            "density": s["density"]["mean"], "union_n": u["n"][-1], "union_density": u["density"][-1],
            "gamma_n": u["gamma"][-1], "overlap_mean": s["overlap"]["mean"], "skew8": s["skewness"]["8"],
            "skew128": s["skewness"]["128"], "union_skew8": s["skewness"].get("union_8"),
            "union_skew128": s["skewness"].get("union_128"), "first_loss": s["loss"][0] if s["loss"] else None,
            "last_loss": s["loss"][-1] if s["loss"] else None,
        })
        union += [{"workload": w, "n": n, "union_density": dn, "gamma_n": g}
                  for n, dn, g in zip(u["n"], u["density"], u["gamma"], strict=True)]
        pairs = pd.read_csv(Path(d, "overlap.csv"))
        overlap.append(pairs.assign(workload=w)[["workload", "step", "i", "j", "overlap"]])
        shares += [{"workload": w, "partition": j, "share": a, "union_share": b} for j, (a, b) in
                   enumerate(zip(s["partition_share"], s["union_partition_share"], strict=True))]
    return {"summary": pd.DataFrame(summary), "union": pd.DataFrame(union),
            "overlap": pd.concat(overlap, ignore_index=True), "shares": pd.DataFrame(shares)}


def kernels_frame(paths: list[str]) -> pd.DataFrame:
    rows = []
    for p in paths:
        sweep = Path(p).stem.removeprefix("sweep_")
        rows += [dict(r, sweep=sweep) for r in json.loads(Path(p).read_text())]
    return pd.DataFrame(rows)


def _ms(value: float | None) -> float | None:
    return None if value is None else 1e3 * value


def _times(s: dict) -> dict:
    """A run's times in ms with their spreads; `comm_ms` is the exposed communication (step time minus the
    no-communication step time) where the run had `none`, else the busy time of the hook's communication."""
    exposed = s.get("comm_exposed_s")
    comm = {"comm_ms": _ms(exposed), "comm_ms_lo": _ms(s.get("comm_exposed_s_lo")),
            "comm_ms_hi": _ms(s.get("comm_exposed_s_hi"))} if exposed is not None else \
        {"comm_ms": _ms(s.get("comm_busy_s_median")), "comm_ms_lo": _ms(s.get("comm_busy_s_p25")),
         "comm_ms_hi": _ms(s.get("comm_busy_s_p75"))}
    return {"samples_per_s": s["samples_per_s"], "samples_per_s_lo": s["samples_per_s_p25"],
            "samples_per_s_hi": s["samples_per_s_p75"], "iter_ms": _ms(s["iter_s_median"]),
            "iter_ms_lo": _ms(s["iter_s_p25"]), "iter_ms_hi": _ms(s["iter_s_p75"]),
            "comm_busy_ms": _ms(s.get("comm_busy_s_median")), **comm}


def train_frames(paths: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One row per (workload, scheme, world size) run, and one per step (loss curves)."""
    runs, steps = [], []
    for p in paths:
        report = json.loads(Path(p).read_text())
        cfg = report["config"]
        key = {"workload": cfg["workload"], "preset": cfg["preset"], "world_size": cfg["world_size"],
               "compress": cfg.get("compress"), "density": cfg.get("density") if cfg.get("compress") else None,
               "compress_warmup": (cfg.get("compress_options") or {}).get("warmup_steps", 0),
               "torchrec": cfg.get("torchrec"),
               "embedding_parameters": (cfg.get("workload_info") or {}).get("embedding_parameters")}
        for run in report["runs"]:
            s = run["summary"]
            runs.append({**key, "scheme": run["scheme"], "backend": cfg.get("backend"), "device": cfg.get("device"),
                         "bandwidth": cfg.get("bandwidth") or "loopback", "steps": cfg["steps"],
                         "warmup": cfg["warmup"], **_times(s),
                         "bytes_received_per_step": s.get("bytes_received_per_step"),
                         "embedding_bytes_received_per_step": s.get("embedding_bytes_received_per_step"),
                         "final_loss": s["final_loss"], "zen_choice": s.get("zen_choice"),
                         "final_residual_norm": s.get("final_residual_norm"), "source": p})
            for i, (loss, it) in enumerate(zip(run["steps"]["loss"], run["steps"]["iter_s"], strict=True)):
                steps.append({**key, "scheme": run["scheme"], "step": i, "loss": loss, "iter_ms": 1e3 * it})
    order = ["workload", "world_size", "scheme"]
    return (pd.DataFrame(runs).sort_values(order).reset_index(drop=True),
            pd.DataFrame(steps).sort_values([*order, "step"]).reset_index(drop=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=("bench", "profile", "concat", "kernels", "train"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--union-out", help="profile: gamma^n per n")
    parser.add_argument("--overlap-out", help="profile: pairwise overlap ratios")
    parser.add_argument("--shares-out", help="profile: share of non-zeros per partition")
    parser.add_argument("--union-dirs", nargs="*", default=[], help="profile: folders of profiles of more "
                        "workers, for gamma^n and the union density")
    parser.add_argument("--steps-out", help="train: one row per step")
    parser.add_argument("inputs", nargs="+")
    args = parser.parse_args(argv)
    if args.kind == "bench":
        frame = bench_frame(args.inputs)
    elif args.kind == "concat":
        frame = pd.concat([pd.read_csv(p) for p in args.inputs], ignore_index=True)
    elif args.kind == "kernels":
        frame = kernels_frame(args.inputs)
    elif args.kind == "train":
        frame, steps = train_frames(args.inputs)
        write_frame(steps, args.steps_out)
    else:
        frames = profile_frames(args.inputs, args.union_dirs)
        for key, path in (("union", args.union_out), ("overlap", args.overlap_out), ("shares", args.shares_out)):
            write_frame(frames[key], path)
        frame = frames["summary"]
    write_frame(frame, args.out)
    print(f"{args.kind}: {len(frame)} rows from {len(args.inputs)} inputs -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
