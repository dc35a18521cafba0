"""Figures (PNG + the CSV behind each) and the generated results/README.md."""

import json

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
if validation_cells():
    FIGURE_INPUTS["sim_validation"] = [AGG + "/sim_validation.csv"]
if PAPER_SIM.get("workloads"):
    FIGURE_INPUTS["sim_paper"] = [AGG + "/sim_paper.csv"]
if SIM_SETTINGS["beyond"].get("workloads"):
    FIGURE_INPUTS["sim_beyond"] = [AGG + "/sim_beyond.csv"]
if FIG8_SIM.get("workloads"):
    FIGURE_INPUTS["sim_fig8"] = [AGG + "/sim_fig8.csv"]
if LLM_SIM.get("models"):
    FIGURE_INPUTS["sim_llm"] = [AGG + "/sim_llm.csv"]


rule plot_figure:
    """One figure: the PNG and, next to it, the CSV of exactly what is drawn."""
    input:
        data=lambda wildcards: FIGURE_INPUTS[wildcards.figure],
        scripts=[SCRIPTS + "/figures.py", SCRIPTS + "/common.py"],
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
        scripts=[SCRIPTS + "/report.py", SCRIPTS + "/claims.py", SCRIPTS + "/common.py"],
    output:
        RESULTS + "/README.md",
    log:
        LOGS + "/write_report.log",
    benchmark:
        BENCHMARKS + "/write_report.tsv"
    params:
        config=shlex.quote(json.dumps(config, sort_keys=True)),
        benchmarks=BENCHMARKS,
    shell:
        "{PY} {SCRIPTS}/report.py --config-json {params.config} --aggregate-dir {AGG} --figures {input.figures}"
        " --build {input.build} --wandb {input.wandb} --benchmarks {params.benchmarks} --out {output} > {log} 2>&1"
