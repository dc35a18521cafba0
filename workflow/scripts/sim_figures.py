"""The step simulator's figures (simulator/, SimGrid): its fidelity against the emulated cluster, the paper's
cluster (Figs 11, 12, 15), beyond it, Fig 8 with latency and contention, the LLMs of Figs 13/14. figures.py
draws them by name (SIM_FIGURES)."""

from __future__ import annotations

from collections.abc import Callable

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from common import color, label, scheme_order
from plots import legend, log2_ranks, panels, scheme_lines


def sim_fidelity(frames: list[pd.DataFrame]) -> tuple[plt.Figure, pd.DataFrame]:
    """Measured vs simulated step time of every fidelity cell, and the error distribution."""
    df = frames[0]
    data = df[["workload", "scheme", "world_size", "bandwidth", "measured_ms", "measured_ms_lo", "measured_ms_hi",
               "simulated_ms"]].copy()
    data["error"] = data["simulated_ms"] / data["measured_ms"] - 1
    fig, (ax, hist) = panels(2)
    for scheme, cell in data.groupby("scheme", sort=True):
        ax.errorbar(cell["measured_ms"], cell["simulated_ms"], xerr=[cell["measured_ms"] - cell["measured_ms_lo"],
                    cell["measured_ms_hi"] - cell["measured_ms"]], fmt="o", ms=4, label=label(scheme),
                    color=color(scheme))
    top = float(max(data["measured_ms_hi"].max(), data["simulated_ms"].max())) * 1.1
    for k, style in ((1.0, "-"), (1.15, "--"), (0.85, "--")):
        ax.plot([0, top], [0, k * top], style, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set(xlabel="measured ms/step (zen train)", ylabel="simulated ms/step (SimGrid)",
           title="(a) every scheme x workload x ranks x link rate")
    hist.hist(100 * data["error"], bins=20, color="grey")
    hist.set(xlabel="(simulated - measured) / measured, %", ylabel="cells",
             title=f"(b) median |error| {data['error'].abs().median():.0%}, max {data['error'].abs().max():.0%}")
    legend(fig, [ax])
    return fig, data


def _cell_lines(axes: list[plt.Axes], cells: list[tuple[tuple, pd.DataFrame]], x: str, y: str, xlabel: str,
                ylabel: str, title: Callable[..., str]) -> None:
    """One panel per cell (a group's key and rows): a line per scheme of y against x."""
    for ax, (key, cell) in zip(axes, cells, strict=False):
        for scheme, line in cell.groupby("scheme", sort=True):
            ax.plot(line[x], line[y], "o-", label=label(scheme), color=color(scheme))
        ax.set(xlabel=xlabel, ylabel=ylabel, title=title(*key))
        ax.grid(alpha=0.3)


def sim_paper(frames: list[pd.DataFrame]) -> tuple[plt.Figure, pd.DataFrame]:
    """At the most machines simulated, per NIC rate: Zen's throughput over each baseline by workload (bars at the
    roofline's compute, whiskers over the compute scales simulated) with the paper's Figs 11/12 values marked;
    and Zen's communication speedup over AllReduce at 25 Gbps beside the paper's Fig 15."""
    from claims import PAPER_FIG11, PAPER_FIG12, PAPER_FIG15

    df = frames[0]
    df = df.assign(compute_scale=df.get("compute_scale", 1.0))
    data = df[df["nodes"] == df["nodes"].max()][
        ["workload", "scheme", "nodes", "gpus_per_node", "world_size", "bandwidth_gbps", "compute_scale",
         "samples_per_s", "step_ms", "exposed_comm_ms", "zen_speedup", "zen_comm_speedup", "model_comm_ms"]]
    rates = sorted(data["bandwidth_gbps"].unique())
    fig, axes = panels(len(rates) + 1, width=5.0)
    for ax, rate in zip(axes, rates, strict=False):
        paper = PAPER_FIG11 if rate == 25.0 else PAPER_FIG12 if rate == 100.0 else {}
        cell = data[(data["bandwidth_gbps"] == rate) & ~data["scheme"].str.startswith("zen")]  # zen's plans: Fig 17b
        workloads = sorted(cell["workload"].unique())
        bases = scheme_order(cell["scheme"].unique())
        width = 0.8 / max(len(bases), 1)
        for k, base in enumerate(bases):
            x = np.arange(len(workloads)) + (k - (len(bases) - 1) / 2) * width
            one = cell[cell["scheme"] == base].groupby("workload")["zen_speedup"]
            mid = [_at_scale(cell, w, base, 1.0) for w in workloads]
            lo, hi = one.min().reindex(workloads).to_numpy(), one.max().reindex(workloads).to_numpy()
            ax.bar(x, mid, width, yerr=[np.array(mid) - lo, hi - np.array(mid)], capsize=2, label=label(base),
                   color=color(base))
            marks = [(xi, paper[w][base]) for xi, w in zip(x, workloads, strict=True) if base in paper.get(w, {})]
            if marks:
                ax.plot(*zip(*marks, strict=True), "k*", ms=10, label="paper" if k == 0 else None)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xticks(range(len(workloads)), workloads)
        ax.set_ylabel("Zen's throughput over it\n(whiskers: compute x0.5-2)")
        ax.set_title(f"Figs 11/12: {rate:g} Gbps, {int(data['nodes'].max())} x 8 GPUs")
    bars = axes[-1]
    top = data[(data["scheme"] == "allreduce") & (data["bandwidth_gbps"] == 25.0) & (data["compute_scale"] == 1.0)]
    bars.bar(top["workload"], top["zen_comm_speedup"], color="grey", label="simulated")
    marks = [(w, PAPER_FIG15[w]) for w in top["workload"] if w in PAPER_FIG15]
    if marks:
        bars.plot(*zip(*marks, strict=True), "k*", ms=10, label="paper")
    bars.set_ylabel("Zen's comm speedup over AllReduce")
    bars.set_title("Fig 15 at 25 Gbps")
    bars.legend(fontsize=7)
    legend(fig, axes[:-1])
    return fig, data


def _at_scale(cell: pd.DataFrame, workload: str, scheme: str, scale: float) -> float:
    hit = cell[(cell["workload"] == workload) & (cell["scheme"] == scheme) & (cell["compute_scale"] == scale)]
    return float(hit["zen_speedup"].iloc[0]) if len(hit) else float("nan")


def sim_beyond(frames: list[pd.DataFrame]) -> tuple[plt.Figure, pd.DataFrame]:
    """Beyond the paper: simulated throughput vs machines per NIC rate, every scheme with BP and HC apart, and
    where BP overtakes HC (HC's step over BP's crosses 1)."""
    df = frames[0]
    data = df[["workload", "scheme", "nodes", "gpus_per_node", "world_size", "bandwidth_gbps", "samples_per_s",
               "step_ms", "exposed_comm_ms", "zen_speedup"]]
    cells = list(data.groupby(["workload", "bandwidth_gbps"], sort=True))
    fig, axes = panels(len(cells) + 1)
    _cell_lines(axes, cells, "world_size", "samples_per_s", "GPUs (8 per machine)", "samples/s (simulated)",
                lambda workload, rate: f"{workload}, {rate:g} Gbps")
    for ax in axes[:len(cells)]:
        ax.set_xscale("log", base=2)
    ratio = axes[-1]
    steps = data.pivot_table(index=["workload", "bandwidth_gbps", "world_size"], columns="scheme", values="step_ms")
    if {"zen-bp", "zen-hc"} <= set(steps.columns):
        for (workload, rate), cell in (steps["zen-hc"] / steps["zen-bp"]).groupby(level=[0, 1]):
            ratio.plot(cell.index.get_level_values(2), cell.values, "o-", label=f"{workload}, {rate:g} Gbps")
        ratio.axhline(1.0, color="grey", lw=0.8)
        ratio.set_xscale("log", base=2)
        ratio.legend(fontsize=7)
    ratio.set(xlabel="GPUs (8 per machine)", ylabel="HC step / BP step (> 1: BP faster)", title="BP against HC")
    ratio.grid(alpha=0.3)
    legend(fig, axes[:-1])
    return fig, data


def sim_fig8(frames: list[pd.DataFrame]) -> tuple[plt.Figure, pd.DataFrame]:
    """Fig 8 simulated (latency, links shared) beside the byte model at the same size, per workload."""
    data = frames[0][["workload", "paper_name", "scheme", "world_size", "bandwidth_gbps", "latency_us", "unit",
                      "density", "sync_ms", "normalized", "bytes_normalized", "messages"]]
    cells = list(data.groupby("workload", sort=True))
    fig, axes = panels(2 * len(cells), width=5.2, height=3.8)
    for k, (workload, cell) in enumerate(cells):
        r = cell.iloc[0]
        for ax, y, what in ((axes[2 * k], "normalized", "simulated: latency, shared links"),
                            (axes[2 * k + 1], "bytes_normalized", "bytes only (the byte model)")):
            scheme_lines(ax, cell, y)
            ax.axhline(1.0, color="black", lw=0.8, ls=":")
            log2_ranks(ax, cell["world_size"])
            ax.set(xlabel="#GPUs (one per machine)", ylabel="comm time / AllReduce's")
            ax.set_title(f"{r['paper_name']} ({workload}), {r['bandwidth_gbps']:g} Gbps: {what}", fontsize="medium")
            ax.grid(alpha=0.3)
    legend(fig, axes)
    return fig, data


def sim_llm(frames: list[pd.DataFrame]) -> tuple[plt.Figure, pd.DataFrame]:
    """Figs 13/14 simulated: tokens/s vs machines per LLM and NIC rate, and Zen's speedups at the largest size."""
    data = frames[0][["model", "paper_name", "scheme", "nodes", "gpus_per_node", "world_size", "bandwidth_gbps",
                      "tokens_per_s", "step_ms", "compute_ms", "exposed_comm_ms", "zen_speedup", "zen_comm_speedup",
                      "density", "union_density", "block_density"]]
    cells = list(data.groupby(["paper_name", "bandwidth_gbps"], sort=True))
    fig, axes = panels(len(cells) + 1)
    _cell_lines(axes, cells, "nodes", "tokens_per_s", "machines (x 8 GPUs, tensor parallel)", "tokens/s (simulated)",
                lambda name, rate: f"{name} + DGC 5%, {rate:g} Gbps")
    bars = axes[-1]
    top = data[(data["nodes"] == data["nodes"].max()) & data["scheme"].isin(["allreduce", "omnireduce"])]
    names = [f"{n}\nover {label(s)}, {r:g}G" for n, s, r in zip(top["paper_name"], top["scheme"],
                                                                 top["bandwidth_gbps"], strict=True)]
    bars.bar(names, top["zen_speedup"], color=[color(s) for s in top["scheme"]])
    bars.axhline(1.0, color="black", lw=0.8, ls=":")
    bars.tick_params(axis="x", labelsize=6, rotation=90)
    bars.set_ylabel("Zen's throughput over it")
    bars.set_title(f"at {int(data['nodes'].max())} machines")
    legend(fig, axes[:-1])
    return fig, data


SIM_FIGURES: dict[str, Callable[[list[pd.DataFrame]], tuple[plt.Figure, pd.DataFrame]]] = {f.__name__: f for f in (
    sim_fidelity, sim_paper, sim_beyond, sim_fig8, sim_llm,
)}
