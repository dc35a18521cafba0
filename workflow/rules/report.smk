"""Figures (PNG + the CSV behind each) and the generated results/README.md."""

import json
from importlib.util import find_spec

# Figure name -> aggregated CSVs it reads (workflow/scripts/figures.py draws each).
FIGURE_INPUTS = {
    "table1_density": [AGG + "/sparsity.csv"],
    "fig2_overlap": [AGG + "/sparsity_overlap.csv", AGG + "/sparsity_union.csv"],
    "fig3_skew": [AGG + "/sparsity_shares.csv", AGG + "/sparsity.csv"],
    "fig8_scale": [AGG + "/scale.csv"],
    "microbench_sim": [AGG + "/microbench.csv"],
    "microbench_real": [AGG + "/microbench.csv"],
    "fig11_throughput": [AGG + "/training.csv"],
    "fig15_comm_speedup": [AGG + "/training.csv"],
    "fig15_model": [AGG + "/cluster.csv", AGG + "/training.csv"],
    "fig16_hashing": [AGG + "/kernels.csv"],
    "fig17_pull": [AGG + "/pull.csv"],
    "fig18_loss": [AGG + "/training_steps.csv"],
    "fig13_compressed": [AGG + "/training_compressed.csv"],
    "fig13_compressed_loss": [AGG + "/training_compressed_steps.csv"],
}
if fidelity_cells():
    FIGURE_INPUTS["sim_fidelity"] = [AGG + "/sim_fidelity.csv"]
if PAPER_SIM.get("workloads"):
    FIGURE_INPUTS["sim_paper"] = [AGG + "/sim_paper.csv"]
if SIM_SETTINGS["beyond"].get("workloads"):
    FIGURE_INPUTS["sim_beyond"] = [AGG + "/sim_beyond.csv"]
if FIG8_SIM.get("workloads"):
    FIGURE_INPUTS["sim_fig8"] = [AGG + "/sim_fig8.csv"]
if LLM_SIM.get("models"):
    FIGURE_INPUTS["sim_llm"] = [AGG + "/sim_llm.csv"]
# The paper's setting simulated by `make simulated` (too long for the default run), committed with its provenance
# (workflow/scripts/simulated.py): drawn from there where this run does not simulate it itself.
COMMITTED_SIM = RESULTS + "/simulated"
COMMITTED_SIM_FILES = sorted(str(p) for p in Path(COMMITTED_SIM).glob("*") if p.suffix in (".csv", ".json"))
for name in ("sim_fidelity", "sim_paper", "sim_beyond", "sim_fig8", "sim_llm"):
    if name not in FIGURE_INPUTS and Path(COMMITTED_SIM, f"{name}.csv").exists():
        FIGURE_INPUTS[name] = [f"{COMMITTED_SIM}/{name}.csv"]
HAVE_SIMGRID = find_spec("simgrid") is not None  # SimGrid is optional: the report says "not run here" without it


rule plot_figure:
    """One figure: the PNG and, next to it, the CSV of exactly what is drawn."""
    input:
        data=lambda wildcards: FIGURE_INPUTS[wildcards.figure],
        scripts=[SCRIPTS + f"/{name}.py" for name in ("figures", "plots", "sim_figures", "common", "claims", "sim_claims")],
    output:
        png=FIGURES + "/{figure}.png",
        csv=FIGURES + "/{figure}.csv",
    log:
        LOGS + "/plot_figure/{figure}.log",
    benchmark:
        BENCHMARKS + "/plot_figure/{figure}.tsv"
    wildcard_constraints:
        figure="|".join(FIGURE_INPUTS),
    shell:
        "{PY} {SCRIPTS}/figures.py {wildcards.figure} --csv {input.data} --out {output.png} > {log} 2>&1"


rule write_report:
    """results/README.md from the aggregated CSVs and figures (never edited by hand)."""
    input:
        figures=expand(FIGURES + "/{figure}.png", figure=FIGURE_INPUTS),
        bench=AGG + "/microbench.csv",
        pull=AGG + "/pull.csv",
        sparsity=AGG + "/sparsity.csv",
        scale=AGG + "/scale.csv",
        cluster=AGG + "/cluster.csv",
        kernels=AGG + "/kernels.csv",
        training=AGG + "/training.csv",
        steps=AGG + "/training_steps.csv",
        compressed=AGG + "/training_compressed.csv",
        compressed_steps=AGG + "/training_compressed_steps.csv",
        torchrec=torchrec_aggregate(),
        build=BUILD_STAMP,
        wandb=RESULTS + "/wandb/bench_runs.json",
        simulated=COMMITTED_SIM_FILES,
        scripts=[SCRIPTS + "/report.py", SCRIPTS + "/claims.py", SCRIPTS + "/common.py", SCRIPTS + "/sim_claims.py",
                 SCRIPTS + "/sim_sections.py", SCRIPTS + "/sim_counterparts.py",
                 SCRIPTS + "/simulated.py"],
    output:
        RESULTS + "/README.md",
    log:
        LOGS + "/write_report.log",
    benchmark:
        BENCHMARKS + "/write_report.tsv"
    params:
        config=shlex.quote(json.dumps(config, sort_keys=True)),
        benchmarks=BENCHMARKS,
        simgrid="yes" if HAVE_SIMGRID else "no",
    shell:
        "{PY} {SCRIPTS}/report.py --config-json {params.config} --aggregate-dir {AGG} --figures {input.figures}"
        " --build {input.build} --wandb {input.wandb} --benchmarks {params.benchmarks} --simulated {COMMITTED_SIM}"
        " --simgrid {params.simgrid} --out {output} > {log} 2>&1"
