"""Write results/README.md: the machine and command, every figure, headline numbers, paper vs ours.

Usage: python workflow/scripts/report.py --config-json '{...}' --aggregate-dir results/aggregate \
           --figures results/figures/*.png [--build results/build/native.txt] [--wandb bench_runs.json] \
           [--benchmarks results/benchmarks] --out results/README.md
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
from claims import PAPER_DENSITY
from common import label
from sim_claims import Simulated, claims_section
from simulated import load as load_simulated

from harness.provenance import write_atomic

AGGREGATES = {"bench": "microbench.csv", "pull": "pull.csv", "sparsity": "sparsity.csv", "scale": "scale.csv",
              "cluster": "cluster.csv", "sim_fidelity": "sim_fidelity.csv", "sim_paper": "sim_paper.csv",
              "sim_beyond": "sim_beyond.csv", "sim_fig8": "sim_fig8.csv", "sim_llm": "sim_llm.csv",
              "kernels": "kernels.csv", "training": "training.csv", "steps": "training_steps.csv",
              "compressed": "training_compressed.csv", "compressed_steps": "training_compressed_steps.csv",
              "torchrec": "training_torchrec.csv"}

FIGURE_TEXT = {
    "table1_density": ("Table 1: embedding-gradient density",
                       "Share of embedding rows with a non-zero gradient on one worker (zen profile, backward "
                       "passes), and after summing the at-scale profile's workers (128 by default: rows from the "
                       "batches' ids, first and last worker checked against backward)."),
    "fig2_overlap": ("Fig 2: overlap and densification",
                     "(a) distribution of the overlap ratio between two workers' non-zero rows; (b) gamma^n, the "
                     "union's non-zeros over one worker's, vs the number of workers summed, up to the at-scale "
                     "profile's 128 (zen profile --rows-from ids)."),
    "fig3_skew": ("Fig 3: non-zeros per partition and skewness",
                  "(a) share of one worker's non-zero rows in each of 8 contiguous partitions (what a range-"
                  "partitioned parameter server would get); (b) skewness = max / mean partition load (zen profile)."),
    "fig8_scale": ("Fig 8: algorithmic communication time vs #GPUs",
                   "Busiest rank's received bytes over the link rate, normalised to AllReduce, for 2..128 GPUs "
                   "(zen scale: exact predicted bytes, checked against the simulation at small sizes), on every "
                   "workload's real trace (128 profiled workers) and on a synthetic zipf pattern at NMT's density."),
    "microbench_sim": ("Microbenchmark, simulated ranks",
                       "Communication time of every scheme divided by AllReduce's, vs the number of ranks, per "
                       "sparsity pattern. Virtual ranks in one process; time = max bytes received by any rank / "
                       "link rate (bandwidth term of the paper's cost model, section 5)."),
    "microbench_real": ("Microbenchmark, real ranks",
                        "Median time per synchronisation call (bar) and p99 (whisker) on real torch.distributed "
                        "ranks, dense input to dense output, extraction included (zen bench)."),
    "fig11_throughput": ("Fig 11: training throughput vs #workers",
                         "Samples per second of data-parallel training with each scheme on the embedding "
                         "gradients (dense AllReduce for the rest), after warm-up, from the median step time; "
                         "shaded: from the 25th-75th percentile step times. All schemes of a world size train "
                         "in one launch, steps interleaved (zen train)."),
    "fig15_comm_speedup": ("Fig 15: communication-time speedup over AllReduce",
                           "Exposed communication per iteration (the scheme's median step time minus the "
                           "no-communication step time of the same run), AllReduce's over each scheme's, at each "
                           "workload's largest world size; whiskers: the range the 25th-75th percentile step "
                           "times allow (zen train)."),
    "fig15_model": ("Fig 15 by model: communication time at the paper's scale",
                    "zen cluster: one step's communication on 16 machines x 8 V100s at 25 Gbps (two-level: "
                    "NVLink inside a machine, each scheme across machines per shard), from every workload's "
                    "128-worker trace (exact bytes) and dense parameter size, with local work at the paper's "
                    "hashing rate. (a) the model; (b) the emulated cluster at each workload's largest trained "
                    "size: measured exposed communication (solid) next to the same model (hatched); the CSV "
                    "has the model's error. A model, not a measurement."),
    "sim_fidelity": ("The step simulator against the emulated cluster",
                       "Each scheme's median step time measured by zen train on the emulated cluster (x; bars: "
                       "25th-75th percentile) against the SimGrid simulation of the same cell (y): the machine's "
                       "compute timeline and recorded schedules, two cores shared by every rank, the shaped "
                       "links (simulator/). Dashed: +-15%. (b) the distribution of the errors."),
    "sim_paper": ("Figs 11, 12 and 15 simulated at the paper's scale",
                  "SimGrid: machines x 8 V100s (NVLink inside, one NIC per machine at 25 or 100 Gbps), the paper-"
                  "density traces (Table 1), each scheme's cross-machine calls recorded from its code, a V100 "
                  "roofline for compute. Per NIC rate, Zen's throughput over each scheme at the most machines "
                  "(whiskers: the roofline's compute halved and doubled), the paper's Figs 11/12 values as stars; "
                  "last, Zen's exposed-communication speedup over AllReduce beside the paper's Fig 15. "
                  "Simulated, not measured."),
    "sim_beyond": ("Beyond the paper: 1,024 GPUs and 400 Gbps, simulated",
                   "The paper's setting simulated past its scale (16 to 128 machines x 8 V100s, 25, 100 and 400 "
                   "Gbps NICs) from traces at Table 1's density (DeepFM and BERT 1,024 workers, NMT's LSTM 512 and "
                   "GPT-2 256 on the presets' text; NMT's LSTM at 1,024 GPUs and GPT-2 at 512 and 1,024 from "
                   "1,024-worker traces with the clothing reviews appended, `zen profile --corpora`), Zen's plans "
                   "apart (BP over hashes or ranges; HC where recorded), each machine one endpoint (per GPU within "
                   "2%, OmniReduce and Sparse PS 4-12% slow: docs/simulator.md): (a) throughput vs GPUs, where each "
                   "scheme crosses another; (b) HC's step over BP's (above 1: BP faster). Simulated, not measured."),
    "sim_fig8": ("Fig 8 with latency and contention, simulated",
                 "Each scheme's sync of the embedding gradient alone on 2..128 GPUs, one per machine (the paper's "
                 "analysis setting), on SimGrid: the real schemes' messages recorded on the profile's row sets, "
                 "an index per element as in the paper's Fig 8, scaled to Table 1's parameters; every message "
                 "pays the link latency and flows meeting on a NIC share it. (a) simulated time over "
                 "AllReduce's; (b) the busiest rank's bytes over AllReduce's (the byte model, same size). "
                 "Simulated, not measured."),
    "sim_llm": ("Figs 13/14 simulated: LLMs with DGC top-5%",
                "SimGrid: machines x 8 V100s, each LLM tensor parallel over a machine's 8 GPUs and data parallel "
                "across machines (GPU j syncs its slice with GPU j of every machine, the 8 sharing the NIC), DGC "
                "top-5% on every parameter. Which elements DGC chooses comes from GPT-2 workers trained with it "
                "(zen profile --compress dgc), their transformer blocks' pattern repeated to the LLM's size; each "
                "scheme's messages recorded from its code; compute a V100 roofline (simulator/llm.py). (a) tokens/s "
                "vs machines; (b) Zen's throughput over AllReduce and OmniReduce at the largest size. Simulated, "
                "not measured."),
    "fig16_hashing": ("Fig 16: hashing time vs r1 and k",
                      "Time of the native hierarchical hashing kernel vs the parallel-region size factor r1 and "
                      "the number of probes k, with the share of indices left to the serial region "
                      "(zen kernels-bench)."),
    "fig17_pull": ("Fig 17: pull encodings and speedup breakdown",
                   "(a) bytes a worker pulls, per encoding, over the dense tensor's bytes, vs the post-aggregation "
                   "density; (b) simulated speedup over AllReduce of range partitioning + COO (Sparse PS), "
                   "hashing + COO and hashing + hash bitmap (Zen BP) (zen bench --backend sim --pull)."),
    "fig13_compressed": ("Figs 13/14 analogue: throughput with DGC vs #workers",
                         "Samples per second with a compressor (DGC) on every dense part of the sparse schemes, "
                         "next to uncompressed dense AllReduce and PyTorch's own PowerSGD and fp16 hooks, from "
                         "the median step time; shaded: from the 25th-75th percentile step times; one launch per "
                         "world size, steps interleaved (zen train --compress)."),
    "fig13_compressed_loss": ("Loss curves with DGC, against dense training",
                              "Training loss per iteration at the largest world size: every compressed scheme "
                              "sums exactly what the compressors chose, so their curves coincide; dashed: "
                              "uncompressed AllReduce (zen train --compress)."),
    "fig18_loss": ("Fig 18: loss curves, Zen vs AllReduce",
                   "Training loss per iteration at the largest world size; Zen is lossless, so the curves "
                   "coincide (zen train)."),
}


# The paper's numbers each figure is compared with (spec zen.md, figure table; the paper ran 16 machines x 8 V100
# at 25 Gbps). Our lstm, dlrm, gpt2 and bert stand in for its LSTM, DeepFM, NMT and BERT.
PAPER_NUMBERS = {
    "table1_density": "Table 1, per-GPU density: " + ", ".join(f"{name} {d:.2%}" for name, d in PAPER_DENSITY.values()),
    "fig2_overlap": "Fig 2, the overlap between workers is partial and varies widely; gamma^n grows with n but stays "
                    "below n (BERT: 1.06% per GPU, 40.8% summed over 128 GPUs, gamma ~38)",
    "fig3_skew": "Fig 3, over 60% of the non-zeros fall in the first of 8 partitions; skewness above 70 for the LSTM "
                 "embedding cut in 128 partitions",
    "fig8_scale": "Fig 8 (NMT, 2..128 GPUs), AGsparse is worse than AllReduce above ~40 GPUs; at 128 GPUs only BP "
                  "beats AllReduce (0.64x its time); BP without index = BP / 2",
    "microbench_sim": "no figure of its own; by Theorem 1 (BP or HC is communication-optimal) Zen should be at or "
                      "below every baseline, and Fig 8 is the same measure up to 128 GPUs",
    "microbench_real": "no figure of its own; the paper's measured numbers are end to end (Fig 11, Fig 15)",
    "fig11_throughput": "Fig 11 (16 machines, 25 Gbps), Zen's throughput is 3.1x AllReduce's, 1.67x SparCML's and "
                        "2.48x OmniReduce's on LSTM; 1.44x OmniReduce's on DeepFM and 1.51x on NMT",
    "fig15_comm_speedup": "Fig 15 (16 machines, 25 Gbps), Zen's communication-time speedup over AllReduce is 6.77x "
                          "on LSTM and 2.10x on DeepFM (3.44x OPT, 3.51x Gemma: not run here); OmniReduce at most "
                          "1.58x; AGsparse, Sparse PS and SparCML sometimes below 1x",
    "fig15_model": "Fig 15 (16 machines x 8 V100, 25 Gbps), Zen's communication-time speedup over AllReduce is "
                   "6.77x on LSTM and 2.10x on DeepFM",
    "sim_fidelity": "no figure in the paper: the simulator's error decides how far its numbers can be trusted",
    "sim_beyond": "no figure in the paper: the paper stops at 16 machines x 8 GPUs and 100 Gbps",
    "sim_fig8": "Fig 8 (NMT, 2..128 GPUs), AGsparse is worse than AllReduce above ~40 GPUs; at 128 GPUs only BP "
                "beats AllReduce (0.64x its time)",
    "sim_llm": "Figs 13/14 (LLMs with DGC top-5%, 16 machines, 25 Gbps), Zen's throughput is about 2.0-2.1x "
               "AllReduce's and 1.6-1.7x OmniReduce's; Fig 15: 3.44x (OPT), 3.51x (Gemma) communication speedup "
               "over AllReduce",
    "sim_paper": "Fig 11 (25 Gbps): 3.1x / 1.67x / 2.48x over AllReduce / SparCML / OmniReduce on LSTM; Fig 12 "
                 "(100 Gbps): 1.44x over SparCML on LSTM; Fig 15: 6.77x (LSTM), 2.10x (DeepFM) over AllReduce",
    "fig16_hashing": "Fig 16, r1 = 2·|G|·d_G is fastest and k = 3 about as fast as k = 4 (about 6 ms for 214M "
                     "elements at 5.2% density on a V100)",
    "fig17_pull": "Fig 17b (LSTM), hashing + COO is 2.74x faster than AllReduce and the hash bitmap adds +13% "
                  "(+34% on Llama); Fig 17a follows the encodings' sizes (COO 2d, hash bitmap 1/32 + d of the "
                  "dense bytes)",
    "fig18_loss": "Fig 18, identical curves for Zen and the baseline",
    "fig13_compressed": "Figs 13/14 (LLMs with DGC top-5%, 25 Gbps), Zen's throughput is about 2.0-2.1x "
                        "AllReduce's and 1.6-1.7x OmniReduce's",
    "fig13_compressed_loss": "the DGC paper: no loss of accuracy after its warm-up; the Zen paper's Fig 18 "
                             "shows identical curves",
}


def _items(xs: Any) -> str:
    return ", ".join(str(x) for x in xs)


def _pcts(xs: Any) -> str:
    return ", ".join(f"{100 * float(x):g}%" for x in xs)


def _ranks(xs: Any) -> str:
    ns = sorted(int(n) for n in xs)
    return f"{ns[0]}..{ns[-1]}" if len(ns) > 2 else "/".join(map(str, ns))


def figure_setting(stem: str, config: dict[str, Any], frames: dict[str, pd.DataFrame]) -> str:
    """The run's setting of one figure, from the resolved config (empty where the config lacks that stage)."""
    try:
        if stem in ("table1_density", "fig2_overlap", "fig3_skew"):
            p = config["profile"]
            return (f"{_items(p['workloads'])}, preset {p['preset']}, {p['workers']} workers emulated in one "
                    f"process, {p['steps']} steps")
        if stem == "fig8_scale":
            s = config["scale"]
            traces = s.get("traces") or []
            return (f"{_items(s['patterns'])} pattern at per-GPU density {_pcts(s['densities'])}, "
                    f"{s['numel']:,} elements, {_ranks(s['world_sizes'])} GPUs, {s.get('link_gbps', 25)} Gbps"
                    + (f"; and the {_items(traces)} profile trace" if traces else ""))
        if stem == "microbench_sim":
            b = config["bench"]["sim"]
            return (f"{_items(b['patterns'])} patterns at density {_pcts(b['densities'])}, {b['numel']:,} elements, "
                    f"{_ranks(b['world_sizes'])} simulated ranks, {b.get('link_gbps', 25)} Gbps")
        if stem == "microbench_real":
            b = config["bench"]["real"]
            return (f"{config.get('backend')} x{_ranks(b['world_sizes'])} ranks, {_items(b['patterns'])} pattern at "
                    f"density {_pcts(b['densities'])}, {b['numel']:,} elements, {b.get('repeats')} timed calls "
                    f"after {b.get('warmup')} warm-up; network: {network(frames.get('bench'))}")
        if stem in ("fig11_throughput", "fig15_comm_speedup", "fig18_loss"):
            t = config["train"]
            grid = ", ".join(f"{w} x{'/'.join(map(str, ns))}" for w, ns in t["grid"].items())
            train = frames.get("training")
            links = (_items(sorted(set(train["bandwidth"].fillna("loopback")))) if train is not None and not train.empty
                     else config.get("bandwidth") or "loopback")
            largest = max(int(n) for ns in t["grid"].values() for n in ns)
            where = {"fig15_comm_speedup": "; drawn at each workload's largest world size",
                     "fig18_loss": f"; drawn at the grid's largest world size, {largest} ranks"}.get(stem, "")
            return (f"{grid} ranks, preset {t['preset']}, {t['steps']} steps ({t['warmup']} warm-up), "
                    f"{config.get('backend')} on {config.get('device', 'cpu')}, {links} links{where}")
        if stem in ("fig13_compressed", "fig13_compressed_loss"):
            t = config["train_compressed"]
            grid = ", ".join(f"{w} x{'/'.join(map(str, ns))}" for w, ns in t["grid"].items())
            options = ", ".join(f"{k}={v}" for k, v in sorted(t.get("options", {}).items()))
            return (f"{grid} ranks, preset {t['preset']}, {t['compress']} at density {_pcts([t['density']])}"
                    f"{f' ({options})' if options else ''}, {t['steps']} steps ({t['warmup']} warm-up), schemes "
                    f"{_items(t['schemes'])}, {config.get('backend')}, {config.get('bandwidth') or 'loopback'} links")
        if stem == "fig16_hashing":
            k = config["kernels"]
            return (f"{k['numel']:,} elements at density {_pcts([k['density']])}, {k['servers']} servers, "
                    f"{k.get('repeats')} repeats, on {config.get('device', 'cpu')}")
        if stem == "fig17_pull":
            p = config["bench"]["pull"]
            return (f"{p['world_size']} simulated ranks, {p['pattern']} pattern at densities {_pcts(p['densities'])}, "
                    f"{p['numel']:,} elements, encodings {_items(p['encodings'])}")
    except (KeyError, TypeError, ValueError):
        return ""
    return ""


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
        # results/ is this pipeline's output (its figures and report are committed): not a change to the code
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ":/",
                                ":(top,exclude)results"], capture_output=True, text=True, check=True).stdout.strip()
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
    return f"emulated cluster, per-node links shaped to {', '.join(links)} (harness/netem.py)"


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


def figure_section(paths: list[str], out_dir: Path, config: dict[str, Any] | None = None,
                   frames: dict[str, pd.DataFrame] | None = None, made_by: str = "") -> list[str]:
    """One entry per figure: the PNG (a relative link), what it shows, the setting, the paper's number, the CSV."""
    lines = ["Each PNG and the CSV of exactly what it draws (same name) live in `results/figures/`: `make` redraws "
             "them with this report (rule plot_figure) and they are committed with it, so the pictures render on "
             f"the repository page. {made_by}Each caption names the setting and the paper's number the figure is "
             "compared with (the paper: 16 machines x 8 V100, 25 Gbps).", ""] if paths else []
    order = list(FIGURE_TEXT)
    for p in sorted(paths, key=lambda q: (order.index(Path(q).stem) if Path(q).stem in order else len(order), q)):
        stem = Path(p).stem
        title, caption = FIGURE_TEXT.get(stem, (stem, ""))
        rel_png = Path(os.path.relpath(p, out_dir)).as_posix()
        rel_csv = Path(os.path.relpath(Path(p).with_suffix(".csv"), out_dir)).as_posix()
        setting = figure_setting(stem, config or {}, frames or {})
        text = caption
        if setting:
            text += f" **Setting:** {setting}."
        if stem in PAPER_NUMBERS:
            text += f" **Paper:** {PAPER_NUMBERS[stem]}."
        lines += [f"### {title}", "", f"![{title}]({rel_png})", "", f"{text} Data: [{rel_csv}]({rel_csv}).", ""]
    return lines


def build_status(path: str | None) -> str:
    if not path or not Path(path).exists():
        return "not built by this pipeline"
    text = Path(path).read_text()
    status = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("status:")), "unknown")
    return status


def cpu_time(benchmarks: str | None) -> str:
    """Total wall time of the pipeline's jobs by rule (Snakemake benchmark files), for the record."""
    if not benchmarks or not Path(benchmarks).is_dir():
        return ""
    totals: dict[str, float] = {}
    for tsv in Path(benchmarks).rglob("*.tsv"):
        rule = tsv.relative_to(benchmarks).parts[0].removesuffix(".tsv")
        try:
            totals[rule] = totals.get(rule, 0.0) + float(pd.read_csv(tsv, sep="\t")["s"].iloc[-1])
        except (KeyError, IndexError, ValueError, pd.errors.ParserError):
            continue
    top = sorted(totals.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{rule} {secs / 60:.1f} min" for rule, secs in top)


PAPER_SHARE = {"lstm": "~80% (from its 6.77x comm. and 3.1x throughput speedups)",
               "gpt2": "~70% (the LLM runs: 3.44x comm. and 2.0x throughput speedups)"}


def training_balance(train: pd.DataFrame) -> list[str]:
    """Per trained cell: AllReduce's share of its step spent communicating (exposed), next to the paper's."""
    lines = ["| workload | preset | ranks | AllReduce ms/step | share communicating | paper | zen ms/step | "
             "no-comm ms/step |", "|---|---|---|---|---|---|---|---|"]
    for (workload, n), cell in train.groupby(["workload", "world_size"], sort=True):
        by = cell.set_index("scheme")
        if "allreduce" not in by.index:
            continue
        ar = by.loc["allreduce"]
        share = ar["comm_ms"] / ar["iter_ms"] if "none" in by.index else float("nan")
        zen = f"{by.loc['zen', 'iter_ms']:.0f}" if "zen" in by.index else "-"
        none = f"{by.loc['none', 'iter_ms']:.0f}" if "none" in by.index else "-"
        lines.append(f"| {workload} | {ar['preset']} | {n} | {ar['iter_ms']:.0f} | {share:.0%} | "
                     f"{PAPER_SHARE.get(workload, '-')} | {zen} | {none} |")
    return lines


def torchrec_section(frame: pd.DataFrame) -> list[str]:
    """torchrec users: per plan and cell, each scheme's step time, its throughput over torchrec's own wrapping,
    and its bytes per step against the data-parallel tables' size."""
    lines = ["## torchrec users: DistributedModelParallel's data-parallel tables", "",
             "The workload's tables sharded by torchrec's DMP (`zen train --torchrec PLAN`): Zen's hook on the DDP "
             "torchrec builds for its data-parallel tables (zen.integrations.torchrec) against torchrec's own "
             "wrapping (`torchrec`: dense fp32 allreduce; `torchrec-fp16`: its allreduce_comm_precision, which "
             "reaches only the dense model's DDP) and the no-op hook (`none`). Plans: dp, every table "
             "data-parallel; mixed, the largest table-wise and the rest data-parallel. Schemes of a cell train in "
             "one launch, steps interleaved; medians after warm-up.", "",
             "| plan | workload | ranks | links | scheme | ms/step | samples/s | over torchrec | MB received/step | "
             "embedding bytes / data-parallel tables |", "|---|---|---|---|---|---|---|---|---|---|"]
    for (plan, workload, n), cell in frame.groupby(["torchrec", "workload", "world_size"], sort=True):
        by = cell.set_index("scheme")
        base = by["samples_per_s"].get("torchrec")
        for scheme, row in by.iterrows():
            ratio = "-" if base is None else f"{row['samples_per_s'] / base:.2f}x"
            mb = row["bytes_received_per_step"]
            tables = 4 * row["embedding_parameters"] if pd.notna(row.get("embedding_parameters")) else None
            share = (f"{row['embedding_bytes_received_per_step'] / tables:.2%}"
                     if tables and pd.notna(row["embedding_bytes_received_per_step"]) else "-")
            lines.append(f"| {plan} | {workload} | {n} | {row['bandwidth']} | {scheme} | {row['iter_ms']:.0f} | "
                         f"{row['samples_per_s']:.0f} | {ratio} | {'-' if pd.isna(mb) else f'{mb / 1e6:.2f}'} | "
                         f"{share} |")
    return lines


def render(config: dict[str, Any], frames: dict[str, pd.DataFrame], figures: list[str], wandb: dict | None,
           out: Path, info: dict[str, Any], build: str, job_time: str, sim: Simulated | None = None) -> str:
    sim = sim or Simulated({}, {}, False)
    bench = frames.get("bench")
    revision = git_revision()
    lines = ["# Zen reproduction: results", "",
             "Generated by the Snakemake pipeline (`Snakefile`, docs/pipeline.md); do not edit by hand.", "",
             "## How this was produced", "",
             f"- command: `{os.environ.get('ZEN_PIPELINE_COMMAND', 'snakemake')}` "
             f"(config `{config.get('run_name')}`), {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M UTC}",
             f"- code: git {revision}",
             f"- machine: {info['host']}, {info.get('cpu')}, {info['cpus']} CPUs, "
             f"{info.get('memory_gib', '?')} GiB RAM, {', '.join(info['gpus']) or 'no GPU'}; "
             f"{info['platform']}, Python {info['python']}, torch {info['torch']}",
             f"- real-rank runs: backend {config.get('backend')}, launcher {config.get('launcher')}; "
             f"network: {network(bench)}",
             f"- native kernels: {build}"]
    train = frames.get("training")
    if train is not None and not train.empty:
        links = sorted(set(train["bandwidth"].fillna("loopback")))
        lines.append(f"- training runs: {', '.join(links)} links; timed jobs (training, real-rank benchmarks, "
                     "kernel timings) take every core, so nothing else runs while they are timed")
    if wandb:
        lines.append(f"- wandb: {len(wandb['runs'])} benchmark runs and every training run logged ({wandb['mode']}) "
                     f"in project `{wandb['project']}`, group `{wandb['group']}` (benchmarks under `{wandb['dir']}`, "
                     "training under `results/train/<workload>/wandb`)")
    if job_time:
        lines.append(f"- job time by rule: {job_time}")
    lines.append("")
    lines += claims_section(frames, sim)
    if train is not None and not train.empty:
        lines += ["## Training presets: how communication-bound they are", "", *training_balance(train), ""]
    torchrec = frames.get("torchrec")
    if torchrec is not None and not torchrec.empty:
        lines += [*torchrec_section(torchrec), ""]
    lines += ["Not measured here: Fig 12 (100 Gbps RDMA) needs that network, and Figs 13/14 run a small GPT-2 (the "
              "`scaled` preset) with DGC top-5%, not the paper's 2-3B-parameter LLMs: both come from the simulator at "
              "the paper's setting. Fig 17a's tensor-block line is OmniReduce's measured pull.", ""]
    if bench is not None and not bench.empty:
        lines += ["## Headline numbers (microbenchmarks)", "", *bench_headlines(bench), ""]
    made_by = ("[How this was produced](#how-this-was-produced) says which command, code and machine made them "
               f"(git {revision}, on {info['host']}: {info.get('cpu')}, {info['cpus']} CPUs, "
               f"{', '.join(info['gpus']) or 'no GPU'}). ")
    lines += ["## Figures", "", *figure_section(figures, out.parent, config, frames, made_by)]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-json", required=True, help="the resolved pipeline config as JSON")
    parser.add_argument("--aggregate-dir", required=True, help="folder of the aggregated CSVs")
    parser.add_argument("--figures", nargs="*", default=[])
    parser.add_argument("--build", default=None, help="output of the build_kernels rule")
    parser.add_argument("--wandb", default=None, help="manifest written by wandb_log.py")
    parser.add_argument("--benchmarks", default=None, help="Snakemake benchmark folder")
    parser.add_argument("--simulated", type=Path, default=None, help="committed simulation outputs (results/simulated)")
    parser.add_argument("--simgrid", choices=["yes", "no"], default="no", help="whether SimGrid imports here")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    frames = {key: pd.read_csv(Path(args.aggregate_dir, name)) for key, name in AGGREGATES.items()
              if Path(args.aggregate_dir, name).exists()}
    committed, notes = load_simulated(args.simulated) if args.simulated else ({}, {})
    own = {k: v for k, v in frames.items() if k.startswith("sim_")}  # this run's simulations replace the committed
    notes.update({k: "this run" for k in own})
    sim = Simulated({**committed, **own}, notes, args.simgrid == "yes")
    wandb = json.loads(Path(args.wandb).read_text()) if args.wandb else None
    out = Path(args.out)
    text = render(json.loads(args.config_json), frames, args.figures, wandb, out, machine(), build_status(args.build),
                  cpu_time(args.benchmarks), sim)
    write_atomic(out, text)
    print(f"report -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
