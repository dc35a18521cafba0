"""Figures (PNG + the CSV behind each) and the generated results/README.md."""

import json

FIGURE_DIR = RESULTS + "/figures"


rule plot_microbench:
    """Figure from the aggregated microbenchmark rows: `sim` (ratios vs ranks) or `real` (measured)."""
    input:
        RESULTS + "/aggregate/microbench.csv",
    output:
        png=FIGURE_DIR + "/microbench_{kind}.png",
        csv=FIGURE_DIR + "/microbench_{kind}.csv",
    log:
        LOGS + "/plot_microbench/{kind}.log",
    benchmark:
        BENCHMARKS + "/plot_microbench/{kind}.tsv"
    wildcard_constraints:
        kind="sim|real",
    shell:
        "{PY} {SCRIPTS}/figures.py microbench-{wildcards.kind} --csv {input} --out {output.png} > {log} 2>&1"


rule log_bench_wandb:
    """Replay every microbenchmark cell into wandb (offline by default), grouped by run_name."""
    input:
        sim_bench_outputs(),
        real_bench_outputs(),
    output:
        RESULTS + "/wandb/bench_runs.json",
    log:
        LOGS + "/log_bench_wandb.log",
    benchmark:
        BENCHMARKS + "/log_bench_wandb.tsv"
    params:
        group=config["run_name"],
        project=config["wandb"]["project"],
        mode=config["wandb"]["mode"],
        dir=RESULTS + "/wandb",
    shell:
        "{PY} {SCRIPTS}/wandb_log.py --group {params.group} --project {params.project} --mode {params.mode}"
        " --dir {params.dir} --out {output} {input} > {log} 2>&1"


def report_figures():
    return expand(FIGURE_DIR + "/microbench_{kind}.png", kind=["sim", "real"])


rule write_report:
    """results/README.md from the aggregated CSVs and figures (never edited by hand)."""
    input:
        bench=RESULTS + "/aggregate/microbench.csv",
        figures=report_figures(),
        wandb=RESULTS + "/wandb/bench_runs.json",
        scripts=[SCRIPTS + "/report.py", SCRIPTS + "/common.py"],
    output:
        RESULTS + "/README.md",
    log:
        LOGS + "/write_report.log",
    benchmark:
        BENCHMARKS + "/write_report.tsv"
    params:
        config=shlex.quote(json.dumps(config, sort_keys=True)),
    shell:
        "{PY} {SCRIPTS}/report.py --config-json {params.config} --bench {input.bench}"
        " --figures {input.figures} --wandb {input.wandb} --out {output} > {log} 2>&1"
