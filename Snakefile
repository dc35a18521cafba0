"""Zen reproduction pipeline: microbenchmarks -> aggregate CSVs -> figures -> results/README.md.

Run from the repository root with the venv: `make` (CPU default config) or
`snakemake --cores all --configfile workflow/config/<name>.yaml [--profile workflow/profiles/slurm]`.
See docs/pipeline.md.
"""

from snakemake.utils import min_version

min_version("8.0")


configfile: "workflow/config/default.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/bench.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        "results/README.md",
