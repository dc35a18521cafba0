"""Write results/README.md: the machine and command, every figure, headline numbers, paper vs ours.

Usage: python workflow/scripts/report.py --config-json '{...}' --bench results/aggregate/microbench.csv \
           --figures results/figures/*.png --wandb results/wandb/bench_runs.json --out results/README.md
Everything is read from the aggregated CSVs, so the text always matches the figures.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd
from common import label, write_text

FIGURE_TEXT = {
    "microbench_sim": ("Simulated microbenchmark (cf. paper Fig 8)",
                       "Communication time of every scheme divided by AllReduce's, vs the number of ranks, "
                       "per sparsity pattern. Virtual ranks in one process; time = max bytes received by any "
                       "rank / link rate (bandwidth term of the paper's cost model, section 5)."),
    "microbench_real": ("Measured microbenchmark on real ranks",
                        "Median time per synchronisation call (bar) and p99 (whisker) on real torch.distributed "
                        "ranks, dense input to dense output, extraction included."),
}


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"host": platform.node(), "platform": platform.platform(),
                            "python": platform.python_version(), "cpus": os.cpu_count()}
    try:
        model = [ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                 if ln.startswith("model name")]
        info["cpu"] = model[0] if model else platform.processor()
        mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
        info["memory_gib"] = round(mem_kb / 2**20, 1)
    except (OSError, ValueError, IndexError):
        info["cpu"] = platform.processor()
    import torch

    info["torch"] = torch.__version__
    info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def git_revision() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, check=True).stdout.strip()
        return rev.stdout.strip() + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def network(bench: pd.DataFrame | None) -> str:
    if bench is None or bench.empty or (bench["backend"] == "sim").all():
        return "no real-rank runs"
    links = sorted(set(bench.loc[bench["backend"] != "sim", "bandwidth"].fillna("loopback")))
    if links == ["loopback"]:
        return ("loopback (no emulated cluster: it needs root and iproute2, or `bandwidth: null` was set); "
                "measured times are CPU-bound, not link-bound")
    return f"emulated cluster, per-node links shaped to {', '.join(links)} (zen/netem.py)"


def _fmt(x: float, unit: str = "x") -> str:
    return "-" if x is None or pd.isna(x) else f"{x:.2f}{unit}"


def bench_headlines(bench: pd.DataFrame) -> list[str]:
    lines = []
    sim = bench[bench["backend"] == "sim"]
    if not sim.empty:
        n = sim["world_size"].max()
        lines.append(f"Simulated, {n} ranks, numel {sim['numel'].iloc[0]:,}, "
                     f"{sim['time_source'].iloc[0]} (speedup over AllReduce; best baseline in brackets):")
        for (pattern, density), cell in sim[sim["world_size"] == n].groupby(["pattern", "density"]):
            lines.append("- " + _speedup_line(cell, f"{pattern}, density {density:g}, union density "
                                                     f"{cell['union_density'].iloc[0]:.3f}"))
    real = bench[bench["backend"] != "sim"]
    if not real.empty:
        lines.append("")
        lines.append("Measured on real ranks (median time per call):")
        for (backend, pattern, density, n), cell in real.groupby(["backend", "pattern", "density", "world_size"]):
            lines.append("- " + _speedup_line(cell, f"{backend} x{n}, {pattern}, density {density:g}, "
                                                     f"{cell['bandwidth'].iloc[0]}"))
        wrong = int((~real["correct"].astype(bool)).sum()) + int((~sim["correct"].astype(bool)).sum())
        lines.append(f"- wrong results across all microbenchmark rows: {wrong}")
    return lines


def _speedup_line(cell: pd.DataFrame, what: str) -> str:
    by = cell.set_index("scheme")["speedup_vs_allreduce"]
    baselines = by.drop([s for s in by.index if s.startswith("zen") or s == "allreduce"], errors="ignore")
    best = baselines.idxmax() if len(baselines) else None
    zen = by.get("zen")
    text = f"{what}: Zen {_fmt(zen)}"
    if best is not None:
        text += f" [{label(best)} {_fmt(baselines[best])}; Zen / best baseline {_fmt(zen / baselines[best])}]"
    return text


def figure_section(paths: list[str], out_dir: Path) -> list[str]:
    lines = []
    for p in sorted(paths):
        stem = Path(p).stem
        title, caption = FIGURE_TEXT.get(stem, (stem, ""))
        rel_png = os.path.relpath(p, out_dir)
        rel_csv = os.path.relpath(Path(p).with_suffix(".csv"), out_dir)
        lines += [f"### {title}", "", f"![{title}]({rel_png})", "", f"{caption} Data: [{rel_csv}]({rel_csv}).", ""]
    return lines


def render(config: dict[str, Any], bench: pd.DataFrame | None, figures: list[str], wandb: dict | None,
           out: Path, info: dict[str, Any]) -> str:
    lines = ["# Zen reproduction: results", "",
             "Generated by the Snakemake pipeline (`Snakefile`, docs/pipeline.md); do not edit by hand.", "",
             "## How this was produced", "",
             f"- command: `{os.environ.get('ZEN_PIPELINE_COMMAND', 'snakemake')}` "
             f"(config `{config.get('run_name')}`), {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M UTC}",
             f"- code: git {git_revision()}",
             f"- machine: {info['host']}, {info.get('cpu')}, {info['cpus']} CPUs, "
             f"{info.get('memory_gib', '?')} GiB RAM, {', '.join(info['gpus']) or 'no GPU'}; "
             f"{info['platform']}, Python {info['python']}, torch {info['torch']}",
             f"- real-rank runs: backend {config.get('backend')}, launcher {config.get('launcher')}; "
             f"network: {network(bench)}"]
    if wandb:
        lines.append(f"- wandb: {len(wandb['runs'])} benchmark runs logged ({wandb['mode']}) in project "
                     f"`{wandb['project']}`, group `{wandb['group']}`, under `{wandb['dir']}`")
    lines.append("")
    if bench is not None and not bench.empty:
        lines += ["## Headline numbers", "", *bench_headlines(bench), ""]
    lines += ["## Figures", "", *figure_section(figures, out.parent)]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-json", required=True, help="the resolved pipeline config as JSON")
    parser.add_argument("--bench", default=None, help="aggregated microbenchmark CSV")
    parser.add_argument("--figures", nargs="*", default=[])
    parser.add_argument("--wandb", default=None, help="manifest written by wandb_log.py")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    bench = pd.read_csv(args.bench) if args.bench else None
    wandb = json.loads(Path(args.wandb).read_text()) if args.wandb else None
    out = Path(args.out)
    write_text(out, render(json.loads(args.config_json), bench, args.figures, wandb, out, machine()))
    print(f"report -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
