"""Figures of the pipeline: one PNG plus the CSV behind it per figure, from the aggregated CSVs.

Usage: python workflow/scripts/figures.py FIGURE --csv IN.csv [IN2.csv] --out results/figures/NAME.png
(the data behind the figure goes next to it as NAME.csv). FIGURE is one of FIGURES below.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from common import color, label, marker, save_figure, scheme_order, write_csv


def _panels(n: int, width: float = 4.2, height: float = 3.4) -> tuple[plt.Figure, list[plt.Axes]]:
    cols = min(n, 4)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False, layout="constrained")
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def _legend(fig: plt.Figure, axes: list[plt.Axes]) -> None:
    handles, labels = {}, {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(lab, h)
            labels.setdefault(lab, lab)
    fig.legend(list(handles.values()), list(labels), loc="outside upper center", ncol=min(len(handles), 8),
               frameon=False)


def _log2_ranks(ax: plt.Axes, ranks: pd.Series) -> None:
    """Log2 x axis labelled with the plain rank counts."""
    ticks = sorted(set(int(n) for n in ranks))
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()


def microbench_sim(frames: list[pd.DataFrame]) -> tuple[plt.Figure, pd.DataFrame]:
    """Simulated comm time normalised to AllReduce vs #ranks, one panel per sparsity pattern (cf. Fig 8)."""
    df = frames[0]
    df = df[df["backend"] == "sim"].copy()
    base = df[df["scheme"] == "allreduce"].set_index(["pattern", "density", "world_size"])["time_ms_median"]
    df["time_vs_allreduce"] = [t / base[(p, d, n)] for t, p, d, n in
                               zip(df["time_ms_median"], df["pattern"], df["density"], df["world_size"], strict=True)]
    data = df[["pattern", "density", "world_size", "numel", "scheme", "bytes_received_max", "time_ms_median",
               "time_vs_allreduce", "union_density"]].sort_values(["pattern", "density", "scheme", "world_size"])
    cells = list(data.groupby(["pattern", "density"], sort=True))
    fig, axes = _panels(len(cells))
    for ax, ((pattern, density), cell) in zip(axes, cells, strict=True):
        for scheme in scheme_order(cell["scheme"]):
            s = cell[cell["scheme"] == scheme]
            ax.plot(s["world_size"], s["time_vs_allreduce"], marker=marker(scheme), color=color(scheme),
                    label=label(scheme))
        ax.axhline(1.0, color="black", lw=0.8, ls=":")
        _log2_ranks(ax, cell["world_size"])
        ax.set_yscale("log")
        ax.set_xlabel("#ranks (simulated GPUs)")
        ax.set_ylabel("comm time / AllReduce's")
        ax.set_title(f"{pattern}, density {density:g}")
        ax.grid(alpha=0.3)
    _legend(fig, axes)
    return fig, data


def microbench_real(frames: list[pd.DataFrame]) -> tuple[plt.Figure, pd.DataFrame]:
    """Measured time per call (median, whisker to p99) per scheme on real ranks, one panel per cell."""
    df = frames[0]
    df = df[df["backend"] != "sim"]
    data = df[["backend", "bandwidth", "pattern", "density", "world_size", "numel", "scheme", "time_ms_median",
               "time_ms_p99", "speedup_vs_allreduce", "bytes_received_max", "correct"]]
    cells = list(data.groupby(["pattern", "density", "world_size"], sort=True))
    fig, axes = _panels(len(cells))
    for ax, ((pattern, density, n), cell) in zip(axes, cells, strict=True):
        order = scheme_order(cell["scheme"])
        cell = cell.set_index("scheme").loc[order]
        x = range(len(order))
        ax.bar(x, cell["time_ms_median"], color=[color(s) for s in order],
               label=[label(s) for s in order])
        ax.errorbar(x, cell["time_ms_median"], yerr=[[0] * len(order), cell["time_ms_p99"] - cell["time_ms_median"]],
                    fmt="none", ecolor="black", capsize=3, lw=0.8)
        ax.set_xticks(list(x), [label(s) for s in order], rotation=45, ha="right")
        ax.set_ylabel("time per call (ms)")
        link = cell["bandwidth"].iloc[0]
        ax.set_title(f"{cell['backend'].iloc[0]} x{n}, {pattern}, d={density:g}, {link}\n(bar: median, whisker: p99)",
                     fontsize="medium")
        ax.grid(axis="y", alpha=0.3)
    _legend(fig, axes)
    return fig, data.reset_index(drop=True)


FIGURES: dict[str, Callable[[list[pd.DataFrame]], tuple[plt.Figure, pd.DataFrame]]] = {
    "microbench-sim": microbench_sim,
    "microbench-real": microbench_real,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("figure", choices=sorted(FIGURES))
    parser.add_argument("--csv", nargs="+", required=True, help="aggregated input CSV(s)")
    parser.add_argument("--out", required=True, help="PNG path; the data goes to the same name .csv")
    args = parser.parse_args(argv)
    frames = [pd.read_csv(p) for p in args.csv]
    fig, data = FIGURES[args.figure](frames)
    write_csv(data, Path(args.out).with_suffix(".csv"))
    save_figure(fig, args.out)
    print(f"{args.figure}: {len(data)} points -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
