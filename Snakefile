"""Zen reproduction pipeline: kernels -> sparsity profiles -> traffic at scale -> microbenchmarks ->
end-to-end training -> aggregate CSVs -> figures -> results/README.md.

Run from the repository root with the venv: `make` (CPU default config) or
`snakemake --cores all --configfile workflow/config/<name>.yaml [--profile workflow/profiles/slurm]`.
See docs/pipeline.md.
"""

from snakemake.utils import min_version

min_version("8.0")


configfile: "workflow/config/default.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/build.smk"
include: "workflow/rules/profile.smk"
include: "workflow/rules/scale.smk"
include: "workflow/rules/bench.smk"
include: "workflow/rules/kernels.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/fsdp.smk"
include: "workflow/rules/simulate.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        RESULTS + "/README.md",
        fsdp_aggregate(),
        compressors_aggregate(),


# Cheap steps run where Snakemake runs, never as cluster jobs.
localrules:
    all,
    aggregate_profiles,
    aggregate_scale,
    aggregate_cluster,
    aggregate_microbench,
    aggregate_kernels,
    aggregate_training,
    aggregate_compressed,
    aggregate_compressors,
    aggregate_fidelity,
    aggregate_paper_sim,
    aggregate_fig8_sim,
    aggregate_llm_sim,
    aggregate_torchrec,
    aggregate_fsdp,
    log_bench_wandb,
    plot_figure,
    write_report,
