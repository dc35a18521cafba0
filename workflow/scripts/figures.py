"""Figures of the pipeline: one PNG plus the CSV behind it per figure, from the aggregated CSVs.

Usage: python workflow/scripts/figures.py FIGURE --csv IN.csv [IN2.csv] --out results/figures/FIGURE.png
(the data behind the figure goes next to it as FIGURE.csv). FIGURE is one of FIGURES below; the inputs
each one reads are listed in workflow/rules/report.smk.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from common import color, label, marker, pull_note, save_figure, scheme_order, write_frame
from matplotlib.ticker import FuncFormatter
from plots import legend, log2_ranks, panels, scheme_lines
from sim_figures import SIM_FIGURES


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
    fig, axes = panels(len(cells))
    for ax, ((pattern, density), cell) in zip(axes, cells, strict=True):
        scheme_lines(ax, cell, "time_vs_allreduce")
        ax.axhline(1.0, color="black", lw=0.8, ls=":")
        log2_ranks(ax, cell["world_size"])
        ax.set_yscale("log")
        ax.set(xlabel="#ranks (simulated GPUs)", ylabel="comm time / AllReduce's",
               title=f"{pattern}, density {density:g}")
        ax.grid(alpha=0.3)
    legend(fig, axes)
    return fig, data


def microbench_real(frames: list[pd.DataFrame]) -> tuple[plt.Figure, pd.DataFrame]:
    """Measured time per call (median, whisker to p99) per scheme on real ranks, one panel per cell."""
    df = frames[0]
    df = df[df["backend"] != "sim"]
    data = df[["backend", "bandwidth", "pattern", "density", "world_size", "numel", "scheme", "time_ms_median",
               "time_ms_p99", "speedup_vs_allreduce", "bytes_received_max", "correct"]]
    cells = list(data.groupby(["pattern", "density", "world_size"], sort=True))
    fig, axes = panels(len(cells))
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
    legend(fig, axes)
    return fig, data.reset_index(drop=True)


def _workload_colors(names: list[str]) -> dict[str, tuple[float, ...]]:
    """Workloads are not schemes: they get a separate qualitative palette, stable by sorted name."""
    palette = plt.get_cmap("Set2").colors
    return {w: palette[i % len(palette)] for i, w in enumerate(sorted(names))}


def table1_density(frames: list[pd.DataFrame]) -> tuple[plt.Figure, pd.DataFrame]:
    """Table 1: per-GPU embedding-gradient density and the density after summing n workers."""
    data = frames[0][["workload", "preset", "workers", "embedding_rows", "density", "union_n", "union_density",
                      "gamma_n"]].sort_values("workload")
    fig, ax = plt.subplots(figsize=(6.4, 3.6), layout="constrained")
    x = range(len(data))
    ax.bar([i - 0.2 for i in x], 100 * data["density"], width=0.4, color="#80b1d3", label="one worker")
    ax.bar([i + 0.2 for i in x], 100 * data["union_density"], width=0.4, color="#fb8072",
           label=f"sum of {int(data['union_n'].max())} workers")
    for i, (d, u) in enumerate(zip(data["density"], data["union_density"], strict=True)):
        ax.annotate(f"{100 * d:.2f}%", (i - 0.2, 100 * d), ha="center", va="bottom", fontsize="small")
        ax.annotate(f"{100 * u:.2f}%", (i + 0.2, 100 * u), ha="center", va="bottom", fontsize="small")
    ax.set_xticks(list(x), [f"{w}\n({r:,} rows)" for w, r in zip(data["workload"], data["embedding_rows"],
                                                                  strict=True)])
    ax.set_ylabel("embedding-gradient density (%)")
    ax.set_title(f"Table 1: gradient density per workload (preset {data['preset'].iloc[0]})")
    ax.legend(frameon=False)
    ax.grid(axis="y", alpha=0.3)
    return fig, data


def fig2_overlap(frames: list[pd.DataFrame]) -> tuple[plt.Figure, pd.DataFrame]:
    """Fig 2a: distribution of pairwise overlap ratios; Fig 2b: gamma^n (densification) vs #workers."""
    overlap, union = frames[0], frames[1]
    colors = _workload_colors(list(union["workload"].unique()))
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6), layout="constrained")
    bins = [i / 40 for i in range(41)]
    for w, cell in overlap.groupby("workload"):
        a.hist(cell["overlap"], bins=bins, density=True, histtype="step", lw=1.6, color=colors[w], label=w)
    a.set(xlabel="overlap ratio of two workers' non-zero rows", ylabel="probability density",
          title="(a) overlap distribution")
    for w, cell in union.groupby("workload"):
        b.plot(cell["n"], cell["gamma_n"], marker="o", color=colors[w], label=w)
    ns = sorted(union["n"].unique())
    b.plot(ns, ns, ls=":", color="black", lw=0.8, label="no overlap (gamma^n = n)")
    log2_ranks(b, union["n"])
    b.set(xlabel="#workers (GPUs) summed", ylabel="gamma^n = union nnz / mean nnz", title="(b) densification vs #GPUs")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend(frameon=False, fontsize="small")
    hist = overlap.groupby("workload")["overlap"].describe().reset_index()
    data = union.merge(hist, on="workload", how="left")
    return fig, data


def fig3_skew(frames: list[pd.DataFrame]) -> tuple[plt.Figure, pd.DataFrame]:
    """Fig 3a: share of one worker's non-zeros in each of 8 contiguous partitions; Fig 3b: skewness."""
    shares, summary = frames[0], frames[1]
    colors = _workload_colors(list(summary["workload"]))
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6), layout="constrained")
    workloads = sorted(shares["workload"].unique())
    width = 0.8 / len(workloads)
    for k, w in enumerate(workloads):
        cell = shares[shares["workload"] == w]
        a.bar(cell["partition"] + (k - (len(workloads) - 1) / 2) * width, 100 * cell["share"], width=width,
              color=colors[w], label=w)
    a.axhline(100 / shares["partition"].nunique(), color="black", ls=":", lw=0.8, label="balanced")
    a.set(xlabel="partition of the embedding rows (contiguous, 1/8 each)", ylabel="share of non-zero rows (%)",
          title="(a) non-zeros per partition")
    data = summary[["workload", "skew8", "skew128", "union_skew8", "union_skew128"]].sort_values("workload")
    x = range(len(data))
    b.bar([i - 0.2 for i in x], data["skew8"], width=0.4, color=[colors[w] for w in data["workload"]],
          edgecolor="black", label="8 partitions")
    b.bar([i + 0.2 for i in x], data["skew128"], width=0.4, color=[colors[w] for w in data["workload"]],
          edgecolor="black", hatch="//", label="128 partitions")
    b.set_xticks(list(x), list(data["workload"]))
    b.set_ylabel("skewness = max / mean partition nnz (ratio)")
    b.set_title("(b) skewness of one worker's gradient")
    for ax in (a, b):
        ax.grid(axis="y", alpha=0.3)
        ax.legend(frameon=False, fontsize="small")
    return fig, shares.merge(data, on="workload")


def _ideal_bp_style(scheme: str) -> dict:
    """Fig 8's BP-without-index line: the ideal (indices for free), dashed in its own colour."""
    if scheme != "bp-without-index":
        return {}
    return {"ls": "--", "color": color("zen-bp-noindex"), "label": label("zen-bp-noindex")}


def fig8_scale(frames: list[pd.DataFrame]) -> tuple[plt.Figure, pd.DataFrame]:
    """Fig 8: algorithmic communication time normalised to AllReduce vs #GPUs (exact bytes / bandwidth)."""
    data = frames[0].sort_values(["source", "density", "scheme", "world_size"])
    trace = data["source"].astype(str).str.endswith(".pt")  # a trace's mean density varies with n: one panel
    data["panel"] = data["source"].astype(str).where(trace, data["source"].astype(str) + " " + data["density"].map(str))
    cells = list(data.groupby("panel", sort=True))
    fig, axes = panels(len(cells), width=5.2, height=3.8)
    for ax, (_, cell) in zip(axes, cells, strict=True):
        source, density = cell["source"].iloc[0], cell.loc[cell["world_size"].idxmax(), "density"]
        scheme_lines(ax, cell, "normalized", _ideal_bp_style)
        ax.axhline(1.0, color="black", lw=0.8, ls=":")
        log2_ranks(ax, cell["world_size"])
        ax.set_xlabel("#GPUs")
        ax.set_ylabel("comm time / AllReduce's")
        what = f"{Path(source).stem} trace (zen profile)" if str(source).endswith(".pt") else f"{source} pattern"
        ax.set_title(f"{what}, per-GPU density {density:.2%}", fontsize="medium")
        ax.grid(alpha=0.3)
    legend(fig, axes)
    return fig, data


def fig11_throughput(frames: list[pd.DataFrame]) -> tuple[plt.Figure, pd.DataFrame]:
    """Fig 11: training throughput vs #workers, one panel per workload."""
    return _throughput(frames[0])


def fig13_compressed(frames: list[pd.DataFrame]) -> tuple[plt.Figure, pd.DataFrame]:
    """Figs 13/14: the same with a compressor (DGC) on the sparse schemes, next to dense AllReduce and
    PyTorch's PowerSGD / fp16 hooks."""
    return _throughput(frames[0])


def _throughput(df: pd.DataFrame) -> tuple[plt.Figure, pd.DataFrame]:
    columns = ["workload", "preset", "scheme", "world_size", "backend", "bandwidth", "samples_per_s",
               "samples_per_s_lo", "samples_per_s_hi", "iter_ms", "comm_ms", "compress", "density"]
    data = df[[c for c in columns if c in df]]
    cells = list(data.groupby("workload", sort=True))
    fig, axes = panels(len(cells))
    for ax, (workload, cell) in zip(axes, cells, strict=True):
        scheme_lines(ax, cell, "samples_per_s", band=True)
        log2_ranks(ax, cell["world_size"])
        ax.set_xlabel("#workers (ranks)")
        ax.set_ylabel("throughput (samples/s)")
        squeeze = _compressor(cell)
        ax.set_title(f"{workload} ({cell['preset'].iloc[0]}), {cell['backend'].iloc[0]}, "
                     f"{cell['bandwidth'].iloc[0]}{squeeze}")
        ax.grid(alpha=0.3)
    legend(fig, axes)
    return fig, data


def _compressor(cell: pd.DataFrame) -> str:
    if "compress" not in cell or cell["compress"].isna().all():
        return ""
    return f", {cell['compress'].dropna().iloc[0]} {100 * float(cell['density'].dropna().iloc[0]):g}%"


def fig15_comm_speedup(frames: list[pd.DataFrame]) -> tuple[plt.Figure, pd.DataFrame]:
    """Fig 15: communication-time speedup over AllReduce per workload and scheme, at each workload's largest
    world size; the error bars are the range the two schemes' step-time spreads allow."""
    df = frames[0]
    df = df[(df["world_size"] == df.groupby("workload")["world_size"].transform("max")) & (df["scheme"] != "none")]
    base = df[df["scheme"] == "allreduce"].set_index("workload")
    rows = []
    for _, r in df.iterrows():
        b = base.loc[r["workload"]]
        rows.append({"workload": r["workload"], "world_size": r["world_size"], "scheme": r["scheme"],
                     "comm_ms": r["comm_ms"], "speedup": b["comm_ms"] / r["comm_ms"] if r["comm_ms"] > 0 else np.nan,
                     "speedup_lo": b["comm_ms_lo"] / r["comm_ms_hi"] if r["comm_ms_hi"] > 0 else np.nan,
                     "speedup_hi": b["comm_ms_hi"] / r["comm_ms_lo"] if r["comm_ms_lo"] > 0 else np.nan})
    data = pd.DataFrame(rows)
    workloads = sorted(data["workload"].unique())
    schemes = scheme_order(data["scheme"])
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(workloads) + 2), 3.8), layout="constrained")
    width = 0.8 / len(schemes)
    for k, scheme in enumerate(schemes):
        s = data[data["scheme"] == scheme].set_index("workload").reindex(workloads)
        xs = [i + (k - (len(schemes) - 1) / 2) * width for i in range(len(workloads))]
        err = [(s["speedup"] - s["speedup_lo"]).clip(lower=0).fillna(0),
               (s["speedup_hi"] - s["speedup"]).clip(lower=0).fillna(0)]
        ax.bar(xs, s["speedup"], width=width, color=color(scheme), label=label(scheme), yerr=err, capsize=2,
               error_kw={"lw": 0.8})
    ax.axhline(1.0, color="black", lw=0.8, ls=":")
    ax.set_yscale("log")
    ticks = [f"{w}\n({int(data[data['workload'] == w]['world_size'].iloc[0])} ranks)" for w in workloads]
    ax.set_xticks(range(len(workloads)), ticks)
    ax.set_ylabel("comm-time speedup over AllReduce (x)")
    ax.set_title("exposed communication per step (step time minus the no-communication step time)")
    ax.grid(axis="y", alpha=0.3)
    fig.legend(loc="outside upper center", ncol=len(schemes), frameon=False)
    return fig, data


def cluster_frame(model: pd.DataFrame, training: pd.DataFrame) -> pd.DataFrame:
    """The cluster model's rows, with the measured training cells they model beside them: setting "model
    NxK" (the modelled cluster), "model emulated N" and "measured emulated N" (exposed communication per
    step); `error` is model / measured - 1 where both exist."""
    rows = model[["workload", "scheme", "setting", "world_size", "comm_s", "speedup"]].assign(
        comm_ms=lambda d: 1e3 * d["comm_s"]).drop(columns="comm_s")
    measured = training[training["scheme"] != "none"][["workload", "scheme", "world_size", "comm_ms"]].copy()
    base = measured[measured["scheme"] == "allreduce"].set_index(["workload", "world_size"])["comm_ms"]
    measured["speedup"] = [base.get((w, n), np.nan) / c if c and c > 0 else np.nan
                           for w, n, c in zip(measured["workload"], measured["world_size"], measured["comm_ms"],
                                              strict=True)]
    emulated = rows[rows["setting"].str.startswith("model emulated")]
    measured = measured.merge(emulated[["workload", "scheme", "world_size"]], on=["workload", "scheme", "world_size"])
    measured["setting"] = "measured emulated " + measured["world_size"].astype(str)
    data = pd.concat([rows, measured], ignore_index=True)
    paired = emulated.merge(measured, on=["workload", "scheme", "world_size"], suffixes=("", "_measured"))
    error = {(w, s, n): m / x - 1 for w, s, n, m, x in zip(paired["workload"], paired["scheme"], paired["world_size"],
                                                           paired["comm_ms"], paired["comm_ms_measured"], strict=True)
             if x and x > 0}
    data["error"] = [error.get((w, s, n)) if str(t).startswith("model emulated") else np.nan
                     for w, s, n, t in zip(data["workload"], data["scheme"], data["world_size"], data["setting"],
                                           strict=True)]
    return data.sort_values(["workload", "setting", "scheme"]).reset_index(drop=True)


def fig15_model(frames: list[pd.DataFrame]) -> tuple[plt.Figure, pd.DataFrame]:
    """Fig 15 by model: (a) comm-time speedup over AllReduce on the modelled cluster (16 x 8 GPUs, 25 Gbps);
    (b) the emulated cluster at each workload's largest trained size: measured, and the same model."""
    data = cluster_frame(*frames)
    big = data[data["setting"].str.startswith("model") & ~data["setting"].str.contains("emulated")]
    schemes = scheme_order(data["scheme"])
    workloads = sorted(data["workload"].unique())
    fig, (a, b) = plt.subplots(1, 2, figsize=(max(9.0, 2.6 * len(workloads) + 3), 3.9), layout="constrained")
    width = 0.8 / len(schemes)
    for k, scheme in enumerate(schemes):
        cell = big[big["scheme"] == scheme].set_index("workload").reindex(workloads)
        xs = [i + (k - (len(schemes) - 1) / 2) * width for i in range(len(workloads))]
        a.bar(xs, cell["speedup"], width=width, color=color(scheme), label=label(scheme))
    a.set_xticks(range(len(workloads)), workloads)
    a.set_title(f"(a) model, {big['setting'].iloc[0].removeprefix('model ')} GPUs" if len(big) else "(a) model",
                fontsize="medium")
    emulated = data[data["setting"].str.contains("emulated")]
    largest = emulated.groupby("workload")["world_size"].transform("max")
    emulated = emulated[emulated["world_size"] == largest]
    cells = sorted(emulated["workload"].unique())
    for k, scheme in enumerate(schemes):
        for kind, hatch in (("measured", None), ("model", "//")):
            cell = emulated[(emulated["scheme"] == scheme) & emulated["setting"].str.startswith(kind)]
            cell = cell.set_index("workload").reindex(cells)
            xs = [i + (k - (len(schemes) - 1) / 2) * width + (width / 4 if kind == "model" else -width / 4)
                  for i in range(len(cells))]
            b.bar(xs, cell["speedup"], width=width / 2, color=color(scheme), hatch=hatch,
                  edgecolor="white" if hatch else None, lw=0)
    b.set_xticks(range(len(cells)), [f"{w}\n({int(emulated[emulated['workload'] == w]['world_size'].iloc[0])} ranks)"
                                     for w in cells])
    b.set_title("(b) emulated cluster: measured (solid) and model (hatched)", fontsize="medium")
    for ax in (a, b):
        ax.axhline(1.0, color="black", lw=0.8, ls=":")
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}x" if str(v)[0] in "25" else ""))
        ax.set_ylabel("comm-time speedup over AllReduce (x)")
        ax.grid(axis="y", alpha=0.3)
    fig.legend(*a.get_legend_handles_labels(), loc="outside upper center", ncol=len(schemes), frameon=False)
    return fig, data


def fig16_hashing(frames: list[pd.DataFrame]) -> tuple[plt.Figure, pd.DataFrame]:
    """Fig 16: hashing time vs the memory factor r1 (a) and vs the number of probes k (b)."""
    data = frames[0]
    sweeps = [s for s in ("r1", "k") if s in set(data["sweep"])]
    fig, axes = panels(len(sweeps), width=4.6)
    for ax, sweep in zip(axes, sweeps, strict=True):
        cell = data[data["sweep"] == sweep].sort_values("r1_factor" if sweep == "r1" else "k")
        x = cell["r1_factor"] if sweep == "r1" else cell["k"]
        ax.plot(x, cell["native_ms"], marker="o", color=color("zen"), label=f"{label('zen')} hashing")
        ax2 = ax.twinx()
        ax2.plot(x, cell["serial_pct"], marker="s", ls="--", color="#7f7f7f", label="serial region (%)")
        ax2.set_ylabel("indices in the serial region (%)")
        ax.set_xlabel("r1 (x |G|·d_G)" if sweep == "r1" else "k (probes)")
        ax.set_ylabel("hashing time (ms)")
        ax.set_ylim(bottom=0)
        ax.set_title(f"({'a' if sweep == 'r1' else 'b'}) vs {sweep}: {cell['device'].iloc[0]}, "
                     f"{int(cell['nnz'].iloc[0]):,} non-zeros, n={int(cell['servers'].iloc[0])}", fontsize="medium")
        ax.grid(alpha=0.3)
        lines = ax.get_legend_handles_labels()
        more = ax2.get_legend_handles_labels()
        ax.legend(lines[0] + more[0], lines[1] + more[1], frameon=False, fontsize="small")
    return fig, data


def fig17_pull(frames: list[pd.DataFrame]) -> tuple[plt.Figure, pd.DataFrame]:
    """Fig 17a: pull size / dense size vs post-aggregation density per encoding; 17b: speedup breakdown."""
    df = frames[0].copy()
    itemsize = {"fp32": 4, "bf16": 2, "fp16": 2}
    df["dense_bytes"] = df["numel"] * df["dtype"].map(itemsize)
    df["pull_vs_dense"] = df.get("rx_pull", float("nan")) / df["dense_bytes"]
    df["variant"] = [f"{s} ({p})" if s.startswith("zen") else s for s, p in zip(df["scheme"], df["pull"], strict=True)]
    data = df[df["scheme"] != "allreduce"].drop_duplicates(["variant", "density"])[
        ["variant", "scheme", "pull", "density", "union_density", "rx_pull", "dense_bytes", "pull_vs_dense",
         "speedup_vs_allreduce", "world_size", "numel"]].sort_values(["variant", "density"])
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    styles = {"hash_bitmap": "-", "coo": "--", "bitmap": ":"}
    for _, cell in data.groupby("variant"):
        scheme, pull = cell["scheme"].iloc[0], cell["pull"].iloc[0]
        name = label(scheme) + (f" + {pull.replace('_', ' ')}" if isinstance(pull, str) else "") + pull_note(scheme)
        a.plot(cell["union_density"], cell["pull_vs_dense"], marker=marker(scheme), color=color(scheme),
               ls=styles.get(pull, "-"), label=name)
    a.set_xscale("log")
    a.set_yscale("log")
    a.set(xlabel="post-aggregation density (union of all workers)", ylabel="pull bytes per worker / dense bytes",
          title=f"(a) pull size by encoding, {int(data['world_size'].iloc[0])} workers")
    a.grid(alpha=0.3)
    a.legend(frameon=False, fontsize="small")
    steps = [("sparse_ps", None, "no hashing + COO"), ("zen-bp", "coo", "hashing + COO"),
             ("zen-bp", "hash_bitmap", "hashing + hash bitmap")]
    densities = sorted(data["density"].unique())
    width = 0.8 / len(steps)
    for k, (scheme, pull, name) in enumerate(steps):
        rows = data[(data["scheme"] == scheme) & ((data["pull"] == pull) if pull else True)]
        ys = rows.set_index("density")["speedup_vs_allreduce"].reindex(densities)
        xs = [i + (k - 1) * width for i in range(len(densities))]
        b.bar(xs, ys, width=width, color=color(scheme), hatch="" if pull != "coo" else "//", edgecolor="white",
              label=name)
    b.set_xticks(range(len(densities)), [f"{d:.2%}" for d in densities])
    b.set(xlabel="per-worker density", ylabel="speedup over AllReduce (x, simulated)", title="(b) speedup breakdown")
    b.grid(axis="y", alpha=0.3)
    b.legend(frameon=False, fontsize="small")
    return fig, data


def fig18_loss(frames: list[pd.DataFrame]) -> tuple[plt.Figure, pd.DataFrame]:
    """Fig 18: training loss per iteration, Zen vs AllReduce (lossless: the curves coincide)."""
    return _loss_curves(frames[0], ["allreduce", "zen"])


def fig13_compressed_loss(frames: list[pd.DataFrame]) -> tuple[plt.Figure, pd.DataFrame]:
    """Loss per iteration with the compressor, every scheme against uncompressed dense AllReduce (dashed)."""
    return _loss_curves(frames[0], None)


def _loss_curves(df: pd.DataFrame, schemes: list[str] | None) -> tuple[plt.Figure, pd.DataFrame]:
    """Per workload, at the largest world size, the loss of `schemes` (None: all but `none`)."""
    df = df[df["world_size"] == df["world_size"].max()]
    data = df[df["scheme"].isin(schemes)] if schemes else df[df["scheme"] != "none"]
    if data.empty:
        data = df
    cells = list(data.groupby("workload", sort=True))
    fig, axes = panels(len(cells))
    for ax, (workload, cell) in zip(axes, cells, strict=True):
        for scheme in scheme_order(cell["scheme"]):
            s = cell[cell["scheme"] == scheme]
            ax.plot(s["step"], s["loss"], color=color(scheme), label=label(scheme),
                    ls="--" if scheme == "allreduce" else "-", lw=2.2 if scheme == "allreduce" else 1.2)
        ax.set(xlabel="iteration", ylabel="training loss",
               title=f"{workload}, {int(cell['world_size'].iloc[0])} workers{_compressor(cell)}")
        ax.grid(alpha=0.3)
    legend(fig, axes)
    return fig, data


FIGURES: dict[str, Callable[[list[pd.DataFrame]], tuple[plt.Figure, pd.DataFrame]]] = {f.__name__: f for f in (
    microbench_sim, microbench_real, table1_density, fig2_overlap, fig3_skew, fig8_scale, fig11_throughput,
    fig15_comm_speedup, fig15_model, fig16_hashing, fig17_pull, fig18_loss, fig13_compressed, fig13_compressed_loss,
)} | SIM_FIGURES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("figure", choices=sorted(FIGURES))
    parser.add_argument("--csv", nargs="+", required=True, help="aggregated input CSV(s)")
    parser.add_argument("--out", required=True, help="PNG path; the data goes to the same name .csv")
    args = parser.parse_args(argv)
    frames = [pd.read_csv(p) for p in args.csv]
    fig, data = FIGURES[args.figure](frames)
    write_frame(data, Path(args.out).with_suffix(".csv"))
    save_figure(fig, args.out)
    print(f"{args.figure}: {len(data)} points -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
