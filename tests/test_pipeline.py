"""The Snakemake pipeline: dry runs of both configs (the paper one with the SLURM profile) and unit tests
of the aggregation, figure, claims and report scripts on tiny fake inputs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "workflow" / "scripts"
sys.path.insert(0, str(SCRIPTS))

import aggregate  # noqa: E402
import claims  # noqa: E402
import figures  # noqa: E402
import report  # noqa: E402
import sim_claims  # noqa: E402
import sim_counterparts  # noqa: E402
import sim_sections  # noqa: E402
import simulated  # noqa: E402

SCHEMES = ["allreduce", "agsparse", "sparcml", "zen"]
SIMULATOR_FIGURES = {"sim_fidelity", "sim_paper", "sim_beyond", "sim_fig8", "sim_llm"}


def dry_run(workdir: Path, *args: str) -> tuple[dict[str, int], str]:
    """`snakemake -n` in an empty copy of the repository (links), so the state of results/ and of a pipeline
    running meanwhile never matters; returns the job count per rule and the printed plan."""
    for name in ("Snakefile", "workflow", "zen"):
        (workdir / name).symlink_to(REPO / name)
    cmd = [sys.executable, "-m", "snakemake", "-n", "--cores", "2", *args]
    done = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    stats = done.stdout.split("Job stats:", 1)[1]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", stats, re.M)}, done.stdout


@pytest.mark.slow
def test_default_config_dry_run(tmp_path):
    jobs, _ = dry_run(tmp_path, "--configfile", "workflow/config/default.yaml")
    for rule in ("build_kernels", "profile_sparsity", "predict_scale", "convert_trace", "predict_scale_trace",
                 "virtual_microbench", "measure_microbench",
                 "virtual_pull_encoding", "bench_kernels", "train_workload", "train_compressed", "train_torchrec",
                 "aggregate_torchrec", "plot_figure", "write_report"):
        assert jobs.get(rule, 0) >= 1, (rule, jobs)
    # the step simulator's figures come from `make sim-fidelity` (workflow/config/fidelity.yaml), not the default run
    assert jobs["plot_figure"] == len(set(figures.FIGURES) - SIMULATOR_FIGURES)
    assert not {"measure_timeline", "calibrate_messages", "simulate_fidelity", "simulate_paper"} & set(jobs), jobs


@pytest.mark.slow
def test_default_run_draws_the_committed_simulations(tmp_path):
    """A clone's results/simulated/ (the paper's setting, committed by `make simulated`) is drawn and reported by
    the default run, which simulates nothing itself."""
    committed = {p.stem for p in (REPO / "results" / "simulated").glob("sim_*.csv")}
    if not committed:
        pytest.skip("no committed simulation outputs in this checkout")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "simulated").symlink_to(REPO / "results" / "simulated")
    jobs, plan = dry_run(tmp_path, "--configfile", "workflow/config/default.yaml", "-p")
    assert jobs["plot_figure"] == len(set(figures.FIGURES) - SIMULATOR_FIGURES) + len(committed), jobs
    assert "--simulated results/simulated --simgrid" in plan
    assert not {"simulate_fidelity", "simulate_paper", "simulate_fig8", "simulate_llm"} & set(jobs), jobs


@pytest.mark.slow
def test_fidelity_overlay_dry_run(tmp_path):
    """`make sim-fidelity`'s target: every fidelity cell simulated, the 1 Gbit/s ones from the default run's own
    training cells and the 2.5 Gbit/s ones from launches of their own (emulated links only: on loopback there is
    nothing to compare with)."""
    import os
    import shutil

    if os.geteuid() != 0 or any(shutil.which(t) is None for t in ("ip", "tc", "nsenter", "unshare", "setpriv")):
        pytest.skip("no link emulation here (root and iproute2): the fidelity check has no cells")
    jobs, _ = dry_run(tmp_path, "--configfile", "workflow/config/default.yaml", "workflow/config/fidelity.yaml",
                      "-p", "results/figures/sim_fidelity.png")
    assert jobs["simulate_fidelity"] == 2 * 3 * 2, jobs  # lstm, dlrm x 2, 4, 8 ranks x 1, 2.5 Gbit/s
    # three launches a cell: the 1 Gbit/s cell's own training and two more, and three at 2.5 Gbit/s
    assert jobs["train_fidelity"] == 2 * 3 * (2 + 3) and jobs["train_workload"] >= 1, jobs
    assert jobs["measure_timeline"] == 2 and jobs["calibrate_messages"] == 1 and jobs["plot_figure"] == 1, jobs
    assert "simulate_paper" not in jobs and "write_report" not in jobs, jobs


@pytest.mark.slow
def test_paper_config_dry_run_with_slurm_profile(tmp_path):
    jobs, plan = dry_run(tmp_path, "--profile", "workflow/profiles/slurm", "--configfile", "workflow/config/paper.yaml",
                         "-p", "results/train/lstm/n32.json")
    assert jobs == {"build_kernels": 1, "train_workload": 1, "total": 2}
    assert "nodes=4" in plan and "gres=gpu:8" in plan and "tasks_per_gpu" not in plan
    assert "srun --nodes=4 --ntasks-per-node=1" in plan and "--nnodes=4 --nproc-per-node=8" in plan


@pytest.mark.slow
def test_paper_config_trains_every_registered_compressor(tmp_path):
    """The paper config's `train_compressors`: one launch per registered compressor on its cell, each with its own
    options, aggregated into one CSV."""
    from zen.compress import compressors

    jobs, plan = dry_run(tmp_path, "--configfile", "workflow/config/paper.yaml", "-p",
                         "results/aggregate/training_compressors.csv")
    assert jobs["train_compressor"] == len(compressors()) and jobs["aggregate_compressors"] == 1, jobs
    for name in compressors():
        assert f"--compress {name} --density 0.05" in plan, name
    assert "--compress dgc --density 0.05 --compress-option warmup_steps=20" in plan


@pytest.mark.slow
def test_beyond_the_paper_dry_run(tmp_path):
    """The paper config's `simulator.beyond`: a 1,024-worker trace of its own, one simulation per workload, one
    figure; nothing of the paper-scale grid or the emulated cluster comes with it."""
    jobs, plan = dry_run(tmp_path, "--configfile", "workflow/config/paper.yaml", "-p",
                         "results/figures/sim_beyond.png")
    assert {k: jobs.get(k) for k in ("profile_beyond", "simulate_paper", "aggregate_paper_sim", "plot_figure")} \
        == {"profile_beyond": 1, "simulate_paper": 1, "aggregate_paper_sim": 1, "plot_figure": 1}, jobs
    assert "--workers 1024" in plan and "--nodes 16,32,64,128" in plan and "--bandwidth 400gbit" in plan
    assert "zen-bp,zen-hc" in plan and "--per machine" in plan and "train_workload" not in jobs, jobs


@pytest.mark.slow
def test_fig8_simulated_dry_run(tmp_path):
    """The paper config's `simulator.fig8`: gpt2's at-scale trace, one simulation, one figure."""
    jobs, plan = dry_run(tmp_path, "--configfile", "workflow/config/paper.yaml", "-p", "results/figures/sim_fig8.png")
    assert {k: jobs.get(k) for k in ("profile_at_scale", "simulate_fig8", "aggregate_fig8_sim", "plot_figure")} \
        == {"profile_at_scale": 1, "simulate_fig8": 1, "aggregate_fig8_sim": 1, "plot_figure": 1}, jobs
    assert "--world-sizes 2,4,8,16,32,64,128" in plan and "--latency-us 10" in plan and "--workload gpt2" in plan
    assert "train_workload" not in jobs, jobs


@pytest.mark.slow
def test_llm_simulated_dry_run(tmp_path):
    """The paper config's `simulator.llm`: one DGC profile, one simulation per LLM, one figure."""
    jobs, plan = dry_run(tmp_path, "--configfile", "workflow/config/paper.yaml", "-p", "results/figures/sim_llm.png")
    assert {k: jobs.get(k) for k in ("profile_compressed", "simulate_llm", "aggregate_llm_sim", "plot_figure")} \
        == {"profile_compressed": 1, "simulate_llm": 3, "aggregate_llm_sim": 1, "plot_figure": 1}, jobs
    assert "--compress dgc --density 0.05 --compress-option warmup_steps=20" in plan and "--workers 16" in plan
    assert "--model gemma2-2b" in plan and "--bandwidth 100gbit" in plan and "train_workload" not in jobs, jobs


@pytest.mark.parametrize("name", ["default", "paper"])
def test_configs_match_the_schema_and_bad_keys_do_not(name):
    import yaml
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    schema = str(REPO / "workflow" / "schemas" / "config.schema.yaml")
    cfg = yaml.safe_load((REPO / "workflow" / "config" / f"{name}.yaml").read_text())
    validate(dict(cfg), schema)
    with pytest.raises(WorkflowError):
        validate(dict(cfg, backend="mpi"), schema)


def test_training_schemes_and_compressors_come_from_the_registries():
    """`registered` in a training section: every registered scheme but zen's single-plan variants (`zen-*`), less
    `leave_out`, so the default run trains the schemes it listed by hand before (its make budget unchanged); the
    paper config trains every registered compressor (`train_compressors.compressors: all`)."""
    import yaml

    from harness.pipeline import resolve
    from zen.compress import compressors

    def load(*names: str) -> dict:
        cfg: dict = {}
        for name in names:
            for key, value in yaml.safe_load((REPO / "workflow" / "config" / f"{name}.yaml").read_text()).items():
                cfg[key] = {**cfg[key], **value} if isinstance(value, dict) and key in cfg else value
        return resolve(cfg)

    default = load("default", "fidelity")
    assert default["train"]["schemes"] == ["none", "ddp", "allreduce", "agsparse", "omnireduce", "sparcml", "zen"]
    assert default["train_compressed"]["schemes"] == ["none", "allreduce", "agsparse", "omnireduce", "sparcml", "zen",
                                                      "powersgd-4"]
    assert default["simulator"]["fidelity"]["schemes"] == default["train"]["schemes"]
    assert "train_compressors" not in default
    paper = load("paper")
    assert paper["train"]["schemes"][2:] == ["allreduce", "agsparse", "omnireduce", "sparcml", "sparse_ps", "zen"]
    assert paper["train_compressors"]["compressors"] == compressors()


# ---- scripts on fake data ------------------------------------------------------------------------

def bench_rows(backend: str = "sim", pull: str | None = None) -> list[dict]:
    rows = []
    for n in (4, 8):
        for i, s in enumerate(SCHEMES):
            t = 10.0 / (i + 1)
            rows.append({"scheme": s, "backend": backend, "world_size": n, "numel": 1000, "density": 0.01,
                         "pattern": "random", "dtype": "fp32", "bandwidth": None, "union_density": 0.04,
                         "bytes_received_max": 4000 // (i + 1), "time_ms_median": t, "time_ms_p99": 1.2 * t,
                         "time_source": "bytes/bandwidth", "speedup_vs_allreduce": 10.0 / t, "correct": True,
                         "times_ms": [t], "phases_received_max": {"pull": 100 * (i + 1), "meta": 8},
                         "config": {"options": {s: {"pull": pull}} if pull and s == "zen" else {}}})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_bench_aggregation_flattens_phases_and_pull(tmp_path):
    frame = aggregate.bench_frame([str(write_jsonl(tmp_path / "a.jsonl", bench_rows(pull="coo")))])
    assert len(frame) == 8 and {"rx_pull", "rx_meta", "pull", "times_ms"} <= set(frame.columns)
    assert set(frame.loc[frame["scheme"] == "zen", "pull"]) == {"coo"}
    assert frame["bandwidth"].isna().all()  # sim rows have no link
    real = aggregate.bench_frame([str(write_jsonl(tmp_path / "b.jsonl", bench_rows("gloo")))])
    assert set(real["bandwidth"]) == {"loopback"}


def test_train_aggregation(tmp_path):
    report_json = {"config": {"workload": "lstm", "preset": "tiny", "world_size": 2, "steps": 3, "warmup": 1,
                              "backend": "gloo", "device": "cpu"},
                   "runs": [{"scheme": s, "summary": {"samples_per_s": 100.0 * (i + 1), "samples_per_s_p25": 90.0,
                                                      "samples_per_s_p75": 110.0, "iter_s_median": 0.1,
                                                      "iter_s_p25": 0.09, "iter_s_p75": 0.11,
                                                      "comm_busy_s_median": 0.05 / (i + 1),
                                                      "comm_busy_s_p25": 0.04 / (i + 1),
                                                      "comm_busy_s_p75": 0.06 / (i + 1), "final_loss": 1.0},
                             "steps": {"loss": [3.0, 2.0, 1.0], "iter_s": [0.1, 0.1, 0.1]}}
                            for i, s in enumerate(["allreduce", "zen"])]}
    path = tmp_path / "n2.json"
    path.write_text(json.dumps(report_json))
    runs, steps = aggregate.train_frames([str(path)])
    assert list(runs["scheme"]) == ["allreduce", "zen"] and len(steps) == 6
    rows = claims.training_claims({"training": runs, "steps": steps})
    loss = next(r for r in rows if r["claim"].startswith("Fig 18"))
    assert loss["verdict"] == "match"


def test_compressed_training_aggregation_claims_and_figures(tmp_path):
    """The Figs 13/14 analogue: a DGC run's JSON becomes rows with the compressor, claims against the paper's
    2.0x / 1.6x (also over the fastest other sparse scheme of the run) and the loss after DGC's warm-up, and
    both figures draw."""
    speed = {"allreduce": 1.0, "agsparse": 1.9, "omnireduce": 1.4, "zen": 2.2, "powersgd-4": 2.0}
    report_json = {"config": {"workload": "gpt2", "preset": "scaled", "world_size": 4, "steps": 4, "warmup": 1,
                              "backend": "gloo", "device": "cpu", "bandwidth": "1gbit", "compress": "dgc",
                              "density": 0.05, "compress_options": {"warmup_steps": 2}},
                   "runs": [{"scheme": s, "summary": {"samples_per_s": 100.0 * v, "samples_per_s_p25": 99.0 * v,
                                                      "samples_per_s_p75": 101.0 * v, "iter_s_median": 0.1 / v,
                                                      "iter_s_p25": 0.099 / v, "iter_s_p75": 0.101 / v,
                                                      "comm_busy_s_median": None, "final_loss": 1.0,
                                                      "final_residual_norm": 0.5 if s == "zen" else None},
                             "steps": {"loss": [5.0, 3.0, 2.0, 1.0 + (0.01 if s == "zen" else 0.0)],
                                       "iter_s": [0.1] * 4}}
                            for s, v in speed.items()]}
    path = tmp_path / "n4.json"
    path.write_text(json.dumps(report_json))
    runs, steps = aggregate.train_frames([str(path)])
    assert set(runs["compress"]) == {"dgc"} and set(steps["compress_warmup"]) == {2}
    rows = {r["claim"]: r for r in claims.compressed_claims({"compressed": runs, "compressed_steps": steps})}
    assert rows["Fig 13/14: Zen with dgc 5% over allreduce"]["verdict"] == "match"  # 2.2x vs the paper's 2.0x
    assert rows["Fig 13/14: Zen with dgc 5% over omnireduce"]["verdict"] == "match"
    best_other = rows["Fig 13/14: Zen with dgc 5% over the best other sparse scheme"]
    assert best_other["verdict"] == "short" and best_other["ours"].startswith("1.16x")  # 2.2 / 1.9 vs 1.6
    assert best_other["ours"].endswith(" over agsparse")
    assert rows["Zen has the highest throughput with dgc 5% (gpt2)"]["verdict"] == "match"
    loss = rows["Fig 13/14: zen loss next to dense training (gpt2)"]
    assert loss["verdict"] == "match" and "from step 2" in loss["ours"]
    for name, frame in (("fig13_compressed", runs), ("fig13_compressed_loss", steps)):
        fig, data = figures.FIGURES[name]([frame])
        assert not data.empty
    assert claims.compressed_claims({})[0]["verdict"] == "n/a"


def test_torchrec_training_aggregation_and_report(tmp_path):
    """`zen train --torchrec` JSONs become rows with their plan and the tables' size; the report gives each
    scheme's throughput over torchrec's own wrapping and its embedding bytes against the tables."""
    speed = {"none": 5.0, "torchrec": 1.0, "torchrec-fp16": 1.01, "zen": 3.2}
    report_json = {"config": {"workload": "dlrm", "preset": "small", "world_size": 4, "steps": 8, "warmup": 3,
                              "backend": "gloo", "device": "cpu", "bandwidth": "1gbit", "torchrec": "dp",
                              "workload_info": {"embedding_parameters": 1_000_000}},
                   "runs": [{"scheme": s, "summary": {"samples_per_s": 1000.0 * v, "samples_per_s_p25": 990.0 * v,
                                                      "samples_per_s_p75": 1010.0 * v, "iter_s_median": 1.0 / v,
                                                      "iter_s_p25": 0.99 / v, "iter_s_p75": 1.01 / v,
                                                      "comm_busy_s_median": None, "final_loss": 0.6,
                                                      "bytes_received_per_step": 50_000.0 if s == "zen" else None,
                                                      "embedding_bytes_received_per_step":
                                                          40_000.0 if s == "zen" else None},
                             "steps": {"loss": [0.7, 0.6], "iter_s": [1.0 / v] * 2}} for s, v in speed.items()]}
    path = tmp_path / "n4.json"
    path.write_text(json.dumps(report_json))
    runs, _ = aggregate.train_frames([str(path)])
    assert set(runs["torchrec"]) == {"dp"} and set(runs["embedding_parameters"]) == {1_000_000}
    text = "\n".join(report.torchrec_section(runs))
    assert "| dp | dlrm | 4 | 1gbit | zen | 312 | 3200 | 3.20x | 0.05 | 1.00% |" in text
    assert "| dp | dlrm | 4 | 1gbit | torchrec | 1000 | 1000 | 1.00x | - | - |" in text


def test_best_scheme_verdict_is_noisy_where_the_spreads_overlap():
    """A rerun must not flip "Zen has the highest throughput": only ranges apart give match or short."""
    def cell(zen: tuple[float, float, float], other: tuple[float, float, float]) -> pd.DataFrame:
        return pd.DataFrame([{"scheme": s, "samples_per_s": m, "samples_per_s_lo": lo, "samples_per_s_hi": hi}
                             for s, (lo, m, hi) in (("none", (900, 1000, 1100)), ("zen", zen), ("sparcml", other))])

    assert claims.best_verdict(cell((95, 100, 105), (80, 85, 90)), "zen") == "match"
    assert claims.best_verdict(cell((95, 100, 105), (90, 98, 110)), "zen") == "noisy"
    assert claims.best_verdict(cell((90, 98, 110), (95, 100, 105)), "sparcml") == "noisy"
    assert claims.best_verdict(cell((80, 85, 90), (95, 100, 105)), "sparcml") == "short"


@pytest.mark.parametrize("kind", ["microbench_sim", "microbench_real"])
def test_microbench_figures_write_png_and_csv(tmp_path, kind):
    backend = "sim" if kind.endswith("sim") else "gloo"
    frame = aggregate.bench_frame([str(write_jsonl(tmp_path / "a.jsonl", bench_rows(backend)))])
    csv = tmp_path / "agg.csv"
    frame.to_csv(csv, index=False)
    out = tmp_path / "fig" / f"{kind}.png"
    assert figures.main([kind, "--csv", str(csv), "--out", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"
    drawn = pd.read_csv(out.with_suffix(".csv"))
    assert set(drawn["scheme"]) == set(SCHEMES)


def test_scale_figure_and_claims(tmp_path):
    """Fig 8's crossovers are checked per source: the pattern at NMT's density and every workload's trace."""
    rows = []
    for n in (2, 32, 128):
        for s, norm in (("allreduce", 1.0), ("agsparse", n / 40), ("zen-bp", 0.5), ("bp-without-index", 0.25)):
            rows.append({"scheme": s, "world_size": n, "normalized": norm, "density": 0.0247, "source": "zipf"})
        for s, norm in (("allreduce", 1.0), ("agsparse", n / 60), ("sparcml", 0.9), ("zen-bp", 0.6)):
            rows.append({"scheme": s, "world_size": n, "normalized": norm, "density": 0.005 + n / 1e5,
                         "source": "results/scale/traces/gpt2.pt"})
    frame = pd.DataFrame(rows)
    csv = tmp_path / "scale.csv"
    frame.to_csv(csv, index=False)
    assert figures.main(["fig8_scale", "--csv", str(csv), "--out", str(tmp_path / "f8.png")]) == 0
    got = {r["claim"]: r for r in claims.scale_claims({"scale": frame})}
    pattern, trace = "Fig 8 (zipf pattern at 2.47%)", "Fig 8 (NMT (gpt2) trace)"
    assert got[f"{pattern}: AGsparse worse than AllReduce above ~40 GPUs"]["ours"] == "from 128 GPUs"
    assert got[f"{pattern}: at 128 GPUs only BP beats AllReduce"]["verdict"] == "match"
    assert got["Fig 8: BP without index = BP / 2"]["verdict"] == "match"
    assert got[f"{trace}: AGsparse worse than AllReduce above ~40 GPUs"]["ours"] == "from 128 GPUs"
    assert got[f"{trace}: at 128 GPUs only BP beats AllReduce"]["verdict"] == "short"  # SparCML beats it too
    assert got[f"{trace}: BP's time at 128 GPUs"]["verdict"] == "match"  # 0.6x against the paper's 0.64x


def test_cluster_model_figure_and_claims_label_model_and_error(tmp_path):
    """Fig 15 by model: the modelled cluster's speedups, the emulated cells next to what training measured, and
    the model's error where both exist."""
    model = pd.DataFrame([{"workload": w, "scheme": s, "setting": setting, "world_size": n, "comm_s": t,
                           "speedup": base / t, "uplink_gbps": 25.0, "local_rate": 3.6e10}
                          for w in ("lstm", "dlrm")
                          for setting, n, base in (("model 16x8", 128, 0.06), ("model emulated 4", 4, 1.2))
                          for s, t in (("allreduce", base), ("zen", base / 6.5))])
    training = pd.DataFrame([{"workload": w, "scheme": s, "world_size": 4, "comm_ms": ms, "bandwidth": "1gbit"}
                             for w in ("lstm", "dlrm") for s, ms in (("none", 0.0), ("allreduce", 1000.0),
                                                                     ("zen", 250.0))])
    paths = [tmp_path / "cluster.csv", tmp_path / "training.csv"]
    model.to_csv(paths[0], index=False)
    training.to_csv(paths[1], index=False)
    assert figures.main(["fig15_model", "--csv", *map(str, paths), "--out", str(tmp_path / "f15m.png")]) == 0
    drawn = pd.read_csv(tmp_path / "f15m.csv")
    emulated = drawn[(drawn["setting"] == "model emulated 4") & (drawn["scheme"] == "zen")]
    assert list(emulated["error"].round(3)) == [round(1200 / 6.5 / 250 - 1, 3)] * 2
    assert set(drawn["setting"]) == {"model 16x8", "model emulated 4", "measured emulated 4"}
    got = {r["claim"]: r for r in claims.cluster_claims({"cluster": model, "training": training})}
    assert got["Fig 15 (model): LSTM Zen comm-time speedup over AllReduce"]["verdict"] == "match"  # 6.5 vs 6.77
    assert got["Fig 15 (model): DeepFM Zen comm-time speedup over AllReduce"]["verdict"] == "beat"
    assert got["Cluster model against measurement: lstm Zen at 4 ranks"]["ours"].endswith("(-26%)")


def test_profile_trace_becomes_one_row_space_per_worker(tmp_path, capsys):
    import torch

    from harness.bench.scale import replay_sets
    from zen.cli import main

    trace = {"params": [{"rows": 10}, {"rows": 5}],
             "indices": [[[torch.tensor([1, 2], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)],
                          [torch.tensor([2], dtype=torch.int32), torch.tensor([4], dtype=torch.int32)]]]}
    out = replay_sets(trace, -1)
    assert out["rows"] == 15
    assert [s.tolist() for s in out["sets"]] == [[1, 2, 10], [2, 14]]
    torch.save(trace, tmp_path / "traces.pt")  # what `zen profile` writes, replayed as it is
    assert main(["scale", "--trace", str(tmp_path / "traces.pt"), "--world-sizes", "2", "--schemes", "zen-bp"]) == 0
    assert "zen-bp" in capsys.readouterr().out


def test_colours_are_fixed_per_scheme():
    from common import color

    assert color("zen") != color("allreduce")
    assert color("some-new-scheme") == color("some-new-scheme")


def test_report_renders_without_optional_stages(tmp_path):
    frame = aggregate.bench_frame([str(write_jsonl(tmp_path / "a.jsonl", bench_rows()))])
    info = {"host": "h", "cpu": "c", "cpus": 2, "memory_gib": 1, "gpus": [], "platform": "p", "python": "3",
            "torch": "t"}
    text = report.render({"run_name": "t", "backend": "gloo", "launcher": "spawn"}, {"bench": frame}, [], None,
                         tmp_path / "README.md", info, "status: built", "")
    assert "## The paper's claims next to ours" in text and "| n/a |" in text
    assert "Zen 4.00x" in text  # zen is the 4th scheme: 10 / 2.5


def test_report_figures_name_setting_paper_and_provenance(tmp_path):
    info = {"host": "box", "cpu": "c", "cpus": 2, "memory_gib": 1, "gpus": [], "platform": "p", "python": "3",
            "torch": "t"}
    config = {"run_name": "t", "backend": "gloo", "device": "cpu", "bandwidth": "1gbit",
              "train": {"grid": {"lstm": [2, 4]}, "preset": "scaled", "steps": 12, "warmup": 3}}
    figs = [str(tmp_path / "figures" / f"{name}.png") for name in ("fig18_loss", "fig11_throughput")]
    text = report.render(config, {}, figs, None, tmp_path / "README.md", info, "built", "")
    section = text.split("## Figures", 1)[1]
    assert "[How this was produced](#how-this-was-produced)" in section and "on box: c, 2 CPUs, no GPU)" in section
    assert section.index("Fig 11") < section.index("Fig 18")  # the report's order, not the order given
    assert "![Fig 11: training throughput vs #workers](figures/fig11_throughput.png)" in section
    assert "[figures/fig11_throughput.csv](figures/fig11_throughput.csv)" in section
    assert "**Setting:** lstm x2/4 ranks, preset scaled, 12 steps (3 warm-up), gloo on cpu, 1gbit links." in section
    assert "**Paper:** Fig 11 (16 machines, 25 Gbps), Zen's throughput is 3.1x" in section
    assert "drawn at the grid's largest world size, 4 ranks" in section


def _git(*args: str) -> subprocess.CompletedProcess | None:
    try:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return done


def _tracked() -> set[str]:
    done = _git("ls-files", "-z")
    if done is None or done.returncode != 0:
        pytest.skip("not a git checkout")
    return set(done.stdout.split("\0")) - {""}


MD_LINK = re.compile(r"(!?)\[[^\]]*\]\(<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\)")
HTML_IMG = re.compile(r"<img\b[^>]*\bsrc=[\"']([^\"']+)", re.I)


def test_committed_report_links_resolve_to_tracked_files():
    """results/README.md renders with its pictures on the repository page: every image (and data) link is
    relative and names a file git tracks, so a fresh clone has it."""
    tracked = _tracked()
    assert "results/README.md" in tracked
    text = (REPO / "results" / "README.md").read_text()
    images = [m[2] for m in MD_LINK.finditer(text) if m[1]] + HTML_IMG.findall(text)
    assert images, "the report shows no figure"
    for link in images:
        assert not re.match(r"^[a-z][a-z0-9+.-]*:|^/", link, re.I), f"image link is not relative: {link}"
    links = set(images) | {m[2] for m in MD_LINK.finditer(text)}
    for link in sorted(links):
        if link.startswith("#") or re.match(r"^(https?|mailto):", link):
            continue
        target = (REPO / "results" / link.split("#", 1)[0]).resolve()
        assert target.is_relative_to(REPO), link
        rel = target.relative_to(REPO).as_posix()
        assert rel in tracked and target.is_file(), f"results/README.md links {link}: {rel} is not a tracked file"


def test_gitignore_tracks_the_figures_and_nothing_else_of_results():
    _tracked()  # skips outside a git checkout

    def ignored(path: str) -> bool:
        return _git("check-ignore", "-q", "--no-index", path).returncode == 0

    assert not ignored("results/README.md")
    assert not ignored("results/figures/fig11_throughput.png") and not ignored("results/figures/fig11_throughput.csv")
    assert not ignored("results/simulated/sim_paper.csv") and not ignored("results/simulated/provenance.json")
    for path in ("results/aggregate/training.csv", "results/train/lstm/n2.json", "results/figures/x.log",
                 "results/wandb/run/x.csv", "results/logs/plot_figure/fig2_overlap.log"):
        assert ignored(path), path


def test_beyond_figure_draws_every_rate_and_bp_against_hc():
    """`sim_beyond` from `simulator paper` rows: one panel per workload and NIC rate, and HC's step over BP's per
    rate (the CSV is what is drawn)."""
    rows = [{"workload": "dlrm", "scheme": s, "nodes": n, "gpus_per_node": 8, "world_size": 8 * n,
             "bandwidth_gbps": rate, "samples_per_s": 1e6 / ms, "step_ms": ms, "exposed_comm_ms": ms - 1.0,
             "zen_speedup": 1.0}
            for n in (16, 32) for rate in (25.0, 400.0)
            for s, ms in (("allreduce", 500.0 / n), ("zen", 200.0), ("zen-bp", 200.0), ("zen-hc", 150.0 * n / 16))]
    fig, data = figures.FIGURES["sim_beyond"]([pd.DataFrame(rows)])
    assert len(fig.axes) >= 3 and len(data) == len(rows)
    ratio = fig.axes[2]
    assert len(ratio.lines) == 3  # a line per rate, and 1.0
    assert list(ratio.lines[0].get_ydata()) == pytest.approx([0.75, 1.5])  # HC faster at 16 machines, BP at 32


def test_two_verdicts_put_the_paper_setting_beside_each_measured_claim():
    """A measured claim gets the simulated verdict of the same claim (all of them where several settings simulate
    it, marked stale where its frame is); a claim only the simulation reaches comes after, "not measured here"."""
    here = [claims._row("Fig 11: LSTM throughput, Zen over sparcml", "1.67x", f"1.1{k}x", f"{n} ranks", "short", "cpu")
            for k, n in enumerate((2, 4))]
    there = [{**claims._row("Fig 11: LSTM throughput, Zen over sparcml", "1.67x", "1.24x", "16 x 8", "short", "m"),
              "source": "sim_paper"},
             {**claims._row("Fig 12: LSTM throughput, Zen over sparcml", "1.44x", "1.40x", "100G", "match", ""),
              "source": "sim_paper"}]
    rows = sim_claims.two_verdicts(here, there, stale={"sim_paper"})
    assert [r["claim"] for r in rows] == [here[0]["claim"], here[0]["claim"], there[1]["claim"]]
    assert rows[0]["sim"] == "1.24x (16 x 8)" and rows[1]["sim_verdict"] == "short (stale)"
    assert rows[2]["ours"] == "not measured here" and rows[2]["sim_verdict"] == "match (stale)"
    table = sim_claims.claims_markdown(rows)
    assert table[0].count("|") == table[2].count("|") == 9


def test_committed_simulations_say_where_they_came_from_and_when_they_are_stale(tmp_path, monkeypatch):
    """simulated.save records the commit, date and command; load marks the outputs stale once a source they
    depend on (simulator/, the schemes) changes in a later commit, and not for other files."""
    monkeypatch.chdir(tmp_path)

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "simulator").mkdir()
    (tmp_path / "simulator" / "paper.py").write_text("A = 1\n")
    (tmp_path / "agg").mkdir()
    pd.DataFrame({"x": [1]}).to_csv(tmp_path / "agg" / "sim_paper.csv", index=False)
    git("add", "simulator")
    git("commit", "-qm", "one")
    simulated.save(tmp_path / "agg", ["sim_paper"], tmp_path / "out", "make simulated")
    frames, notes = simulated.load(tmp_path / "out")
    assert list(frames) == ["sim_paper"] and "`make simulated`" in notes["sim_paper"]
    assert "stale" not in notes["sim_paper"]
    (tmp_path / "README").write_text("docs\n")
    git("add", "README")
    git("commit", "-qm", "docs only")
    assert "stale" not in simulated.load(tmp_path / "out")[1]["sim_paper"]
    (tmp_path / "simulator" / "paper.py").write_text("A = 2\n")
    git("commit", "-qam", "the simulator changed")
    assert "**stale**: 1 source files changed since (e.g. simulator/paper.py)" in simulated.load(tmp_path / "out")[1][
        "sim_paper"]


def test_report_says_not_run_here_without_simgrid(tmp_path):
    info = {"host": "h", "cpu": "c", "cpus": 2, "memory_gib": 1, "gpus": [], "platform": "p", "python": "3",
            "torch": "t"}
    v = pd.DataFrame({"simulated_ms": [105.0, 90.0], "measured_ms": [100.0, 100.0]})
    sim = sim_claims.Simulated({"sim_fidelity": v}, {"sim_fidelity": "git abc, 2026-12-03, `make sim-fidelity`"},
                               simgrid=False)
    text = report.render({"run_name": "t"}, {}, [], None, tmp_path / "README.md", info, "built", "", sim)
    assert "not run here: SimGrid's Python module is missing" in text
    assert "- `sim_fidelity`: git abc, 2026-12-03, `make sim-fidelity`" in text
    assert "median 8%, max 10% over 2 cells" in text and "| not measured here |" in text


def _sim_paper_cell(omni_extra: dict[str, float]) -> pd.DataFrame:
    """`simulator paper` rows for LSTM at 16 x 8, 25 Gbps: Zen 1.3x faster than OmniReduce (short of 2.48x)."""
    base = {"workload": "lstm", "nodes": 16, "gpus_per_node": 8, "world_size": 128, "bandwidth_gbps": 25.0,
            "compute_scale": 1.0, "compute_ms": 23.0, "rows": 360000, "width": 1128, "timeline": "roofline",
            "model_comm_ms": float("nan"), "messages": 1280}
    rows = [{**base, "scheme": "zen", "step_ms": 170.0, "exposed_comm_ms": 147.0, "zen_speedup": 1.0,
             "samples_per_s": 100.0},
            {**base, "scheme": "omnireduce", "step_ms": 221.0, "exposed_comm_ms": 198.0, "zen_speedup": 1.3,
             "samples_per_s": 77.0, **omni_extra}]
    return pd.DataFrame(rows)


def test_a_short_omnireduce_row_states_its_priced_block_costs_and_the_traces_skew():
    """The Fig 11 row over OmniReduce, short at the paper's setting, says what its per-block costs came to and the
    trace's skew against the paper's; the section under the table lists the costs per workload and rate."""
    cell = _sim_paper_cell({"block_cost_ns": 85.0, "aggregator_work_ms": 1.5, "round_trip_floor_ms": 2.4,
                            "block_messages": 200_000})
    sparsity = pd.DataFrame({"workload": ["lstm"], "skew128": [24.85], "union_skew128": [16.29]})
    rows = {r["claim"]: r for r in sim_claims.simulator_claims({"sim_paper": cell, "sparsity": sparsity})}
    row = rows["Fig 11: LSTM throughput, Zen over omnireduce"]
    assert row["verdict"] == "short"
    assert "85 ns, measured here, 8 threads) is 1.5 ms on the busiest aggregator" in row["why"]
    assert "at least 2.4 ms, under its 198 ms on the links" in row["why"]
    assert "24.9 at 128 partitions per GPU, 16.3 summed, against the paper's > 70 for its LSTM" in row["why"]
    assert "(200,000 a GPU sends and receives): 1.00 us each on the critical path would close the gap" in row["why"]
    lines = sim_sections.block_cost_lines(cell)
    # Zen's step 170 ms: 2.48 x 170 - 221 = 200.6 ms over 200,000 block messages
    assert lines[2] == "| LSTM | 25 Gbps | 85 ns | 1.50 ms | 2.40 ms | 198 ms | 1.30x (2.48x) | 200,000 | 1.00 us |"
    assert sim_sections.block_cost_lines(_sim_paper_cell({})) == []  # simulated without a block cost: no section


def test_simulated_fig8_says_which_sparcml_it_judges():
    """At 128 GPUs the paper's SSAR_Recursive_double (`sparcml`) is the Fig 8 line judged; the library's own
    pick among SparCML's variants (`sparcml-auto`) is shown in the row, not counted as a line that beats it."""
    rows = []
    for n in (2, 64, 128):
        for s, norm in (("allreduce", 1.0), ("agsparse", n / 40), ("sparcml", 1.3), ("sparcml-auto", 0.85),
                        ("omnireduce", 1.4), ("zen-bp", 0.41)):
            rows.append({"workload": "gpt2", "scheme": s, "world_size": n, "normalized": norm, "density": 0.0238,
                         "source": "t.pt", "bandwidth_gbps": 25.0, "latency_us": 10.0, "unit": "element"})
    got = {r["claim"]: r for r in sim_claims.sim_fig8_claims({"sim_fig8": pd.DataFrame(rows)})}
    row = got["Fig 8 (NMT (gpt2) trace): at 128 GPUs only BP beats AllReduce"]
    assert row["verdict"] == "match" and row["ours"] == "zen-bp 0.41x"
    assert "SparCML is the paper's SSAR_Recursive_double (1.30x AllReduce's time)" in row["why"]
    assert "takes 0.85x" in row["why"]


def test_a_short_simulated_fig8_row_says_how_the_trace_densifies():
    """Where SparCML (the paper's variant) still beats AllReduce at 128 GPUs, the row gives the trace's gamma^128
    beside the ~25 the paper's BP time implies, and BP's time by the paper's COO model."""
    rows = []
    for n in (2, 64, 128):
        for s, norm in (("allreduce", 1.0), ("agsparse", n / 40), ("sparcml", 0.7), ("zen-bp", 0.41)):
            rows.append({"workload": "gpt2", "scheme": s, "world_size": n, "normalized": norm, "density": 0.0238,
                         "source": "t.pt", "bandwidth_gbps": 25.0, "latency_us": 10.0, "unit": "element"})
    sparsity = pd.DataFrame({"workload": ["gpt2"], "union_n": [128], "gamma_n": [17.34], "union_density": [0.412],
                             "density": [0.02376]})
    got = {r["claim"]: r for r in sim_claims.sim_fig8_claims({"sim_fig8": pd.DataFrame(rows), "sparsity": sparsity})}
    row = got["Fig 8 (NMT (gpt2) trace): at 128 GPUs only BP beats AllReduce"]
    assert row["verdict"] == "short" and row["ours"] == "sparcml 0.70x, zen-bp 0.41x"
    assert "gamma^128 = 17.3 (41% after summing) against the ~25 that the paper's BP time implies" in row["why"]
    assert "(1 + 17.3) x 2.38% = 0.44x" in row["why"]


def test_sparcmls_priced_merges_are_listed_with_their_ratio_and_the_papers():
    """The section on SparCML's merges lists, per workload and rate, a merged row's cost, the busiest GPU's
    merges, SparCML's step and Zen's ratio over it with them priced, beside the paper's; none without."""
    cell = _sim_paper_cell({})
    merged = {**cell.iloc[0].to_dict(), "scheme": "sparcml", "step_ms": 255.0, "exposed_comm_ms": 232.0,
              "zen_speedup": 1.5, "merge_ns_per_row": 401.0, "merge_work_ms": 17.0}
    lines = sim_sections.merge_cost_lines(pd.concat([cell, pd.DataFrame([merged])], ignore_index=True))
    assert lines[2] == "| LSTM | 25 Gbps | 401 ns | 17.00 ms | 255.0 ms | 1.50x | 1.67x |"
    assert sim_sections.merge_cost_lines(cell) == []


def test_a_claim_without_its_own_simulation_takes_a_counterpart_or_says_why_not():
    """A measured claim the simulation states under another name takes that row's verdict with the alias's reason;
    one no simulation can judge says why (verdict n/a); only an unmapped claim stays blank."""
    nmt = {**claims._row("Fig 8 (NMT (gpt2) trace): at 128 GPUs only BP beats AllReduce", "BP only", "zen-bp 0.41x",
                         "SimGrid", "match", "as in the paper"), "source": "sim_fig8"}
    here = [claims._row("Fig 8 (zipf pattern at 2.47%): at 128 GPUs only BP beats AllReduce", "BP only", "zen 0.37x",
                        "zen scale", "match", ""),
            claims._row("Fig 18: identical loss curves, Zen vs AllReduce", "identical", "4.8e-07", "4 ranks", "match",
                        ""),
            claims._row("A claim nobody mapped", "-", "1x", "here", "match", "")]
    rows = {r["claim"]: r for r in sim_claims.two_verdicts(here, [nmt], stale=set())}
    alias = rows[here[0]["claim"]]
    assert alias["sim"].startswith("zen-bp 0.41x (SimGrid)") and alias["sim_verdict"] == "match"
    assert alias["sim_why"].startswith("judged on NMT's trace at Table 1's density")
    loss = rows[here[1]["claim"]]
    assert loss["sim"].startswith("not simulated: a loss curve") and loss["sim_verdict"] == "n/a"
    assert rows["A claim nobody mapped"]["sim"] == "- (no simulation of this claim)"


def test_the_simulator_judges_the_cluster_models_cell_at_each_workloads_most_ranks():
    v = pd.DataFrame({"workload": ["lstm"] * 3 + ["dlrm"], "scheme": ["zen", "zen", "agsparse", "zen"],
                      "world_size": [4, 8, 8, 8], "bandwidth": ["1gbit"] * 4,
                      "measured_ms": [100.0, 200.0, 300.0, 100.0], "simulated_ms": [90.0, 190.0, 250.0, 140.0]})
    got = {r["claim"]: r for r in sim_counterparts.fidelity_claims({"sim_fidelity": v})}
    assert set(got) == {"Cluster model against measurement: lstm Zen at 8 ranks",
                        "Cluster model against measurement: dlrm Zen at 8 ranks"}
    lstm, dlrm = (got[f"Cluster model against measurement: {w} Zen at 8 ranks"] for w in ("lstm", "dlrm"))
    assert lstm["ours"] == "simulated 190 ms vs measured 200 ms (-5%)" and lstm["verdict"] == "match"
    assert dlrm["verdict"] == "short"  # +40%


def test_simulated_llms_name_the_best_other_sparse_scheme_and_the_fastest():
    base = {"model": "opt-2.7b", "paper_name": "OPT-2.7B", "nodes": 16, "gpus_per_node": 8, "bandwidth_gbps": 25.0,
            "compute_ms": 2600.0, "tiles": 10, "density": 0.048, "union_density": 0.4, "block_density": 0.99,
            "source": "results/profile_compressed/gpt2"}
    speed = {"allreduce": (2.0, 100.0, 3.4), "agsparse": (1.7, 118.0, 2.8), "omnireduce": (2.1, 95.0, 3.0),
             "zen": (1.0, 200.0, 1.0)}
    s = pd.DataFrame([{**base, "scheme": k, "zen_speedup": a, "tokens_per_s": t, "zen_comm_speedup": c}
                      for k, (a, t, c) in speed.items()])
    got = {r["claim"]: r for r in sim_claims.sim_llm_claims({"sim_llm": s})}
    best = got["Fig 13/14: Zen with dgc 5% over the best other sparse scheme"]
    assert best["ours"] == "1.70x over agsparse" and best["verdict"] == "match"
    assert got["Zen has the highest throughput with dgc 5% (gpt2)"]["ours"] == "best: zen"
    assert got["Fig 15: OPT-2.7B communication-time speedup of Zen over AllReduce"]["ours"] == "3.40x"


def test_simulated_headline_and_workloads_without_a_paper_number():
    """The headline from the largest simulated communication speedup, and Fig 15 for a workload the paper gives no
    number for (n/a, not blank); zen's single-plan variants never count as its rivals."""
    cell = _sim_paper_cell({})
    extra = [{**cell.iloc[0].to_dict(), "scheme": name, "step_ms": step, "exposed_comm_ms": step - 23.0,
              "zen_speedup": 170.0 / step, "zen_comm_speedup": comm, "samples_per_s": 17000.0 / step}
             for name, step, comm in (("allreduce", 850.0, 6.9), ("zen-bp", 160.0, 1.0))]
    top = pd.concat([cell, pd.DataFrame(extra)], ignore_index=True)
    top = pd.concat([top, top.assign(workload="bert")], ignore_index=True)
    got = {r["claim"]: r for r in sim_claims.simulator_claims({"sim_paper": top})}
    head = got["Headline: up to 5.09x communication speedup"]
    assert head["ours"] == "6.90x" and head["verdict"] == "beat"
    assert got["Zen has the highest throughput (bert)"]["ours"] == "best: zen"  # zen-bp is faster, but zen's own
    bert = got["Fig 15: BERT communication-time speedup of Zen over AllReduce"]
    assert bert["paper"] == "-" and bert["verdict"] == "n/a" and bert["ours"].startswith("6.90x")


def test_simulated_fig17b_compares_bps_two_pull_encodings_on_the_lstm_trace():
    """Fig 17b from `simulator fig8`'s LSTM cell at its most GPUs: BP pulling COO over AllReduce, and the hash
    bitmap's gain over COO; nothing where the COO pull was not simulated."""
    base = {"workload": "lstm", "density": 0.0115, "bandwidth_gbps": 25.0, "latency_us": 10.0, "unit": "element"}
    rows = [{**base, "world_size": n, "scheme": s, "sync_ms": ms * (n / 128)}
            for n in (64, 128) for s, ms in (("allreduce", 1000.0), ("zen-bp", 160.0), ("zen-bp-coo", 200.0))]
    got = {r["claim"]: r for r in sim_claims.breakdown_claims({"sim_fig8": pd.DataFrame(rows)})}
    assert got["Fig 17b: hashing + COO speedup over AllReduce (LSTM)"]["ours"] == "5.00x"
    gain = got["Fig 17b: hash bitmap adds over COO (LSTM)"]
    assert gain["ours"] == "+25%" and gain["verdict"] == "beat" and "128 GPUs" in gain["setting"]
    assert sim_claims.breakdown_claims({"sim_fig8": pd.DataFrame(rows[:2])}) == []


def test_committed_report_gives_every_claim_a_verdict_at_the_papers_setting():
    """results/README.md as `make` wrote it: no measured claim is left without a simulated verdict or the reason
    none can exist (sim_counterparts)."""
    text = (REPO / "results" / "README.md").read_text()
    blank = [line.split(" | ")[0] for line in text.splitlines() if "- (no simulation of this claim)" in line]
    assert not blank, blank


def test_the_report_sets_zen_against_the_fastest_other_simulated_scheme():
    """One row per workload and rate: zen's step with the plan it picked against the fastest other scheme, zen's
    single-plan variants left out; nothing where the simulation did not record zen's plan."""
    cell = _sim_paper_cell({})
    extra = pd.DataFrame([{**cell.iloc[0].to_dict(), "scheme": "zen-bp", "step_ms": 100.0},
                          {**cell.iloc[0].to_dict(), "scheme": "sparse_ps", "step_ms": 187.0}])
    top = pd.concat([cell, extra], ignore_index=True).assign(zen_plan=lambda d: d["scheme"].map({"zen": "bp-range"}))
    lines = sim_sections.best_of_all_lines(top)
    assert lines[2:] == ["| LSTM | 25 Gbps | 170.0 (bp-range) | sparse_ps 187.0 | 0.909x |"]
    assert sim_sections.best_of_all_lines(cell) == []
    beyond = pd.concat([top, top.assign(world_size=1024, step_ms=lambda d: d["step_ms"] * 2)], ignore_index=True)
    assert sim_sections.beyond_lines(beyond)[2:] == [  # past the paper's scale: a row per GPU count too
        "| LSTM | 128 | 25 Gbps | 170.0 (bp-range) | sparse_ps 187.0 | 0.909x |",
        "| LSTM | 1,024 | 25 Gbps | 340.0 (bp-range) | sparse_ps 374.0 | 0.909x |"]
    tie = beyond.assign(step_ms=lambda d: d["step_ms"].where(d["scheme"] != "zen", 187.03))
    assert sim_sections.beyond_lines(tie)[2].endswith("| sparse_ps 187.0 | 1.000x (slower by 0.02%) |")

