"""Microbenchmarks (`zen bench`): every scheme on one synthetic gradient per rank (harness/bench)."""


rule simulate_microbench:
    """Virtual ranks in one process: exact bytes per rank, time = max bytes received / link rate."""
    input:
        BUILD_STAMP,
    output:
        RESULTS + "/bench/sim/{pattern}/n{world_size}_d{density}.jsonl",
    log:
        LOGS + "/simulate_microbench/{pattern}/n{world_size}_d{density}.log",
    benchmark:
        BENCHMARKS + "/simulate_microbench/{pattern}/n{world_size}_d{density}.tsv"
    params:
        numel=config["bench"]["sim"]["numel"],
        link_gbps=config["bench"]["sim"]["link_gbps"],
        schemes=csv_list(config["schemes"]),
        seed=config["seed"],
    shell:
        "{ZEN} bench --backend sim --world-size {wildcards.world_size} --schemes {params.schemes}"
        " --numel {params.numel} --density {wildcards.density} --pattern {wildcards.pattern}"
        " --sim-bandwidth-gbps {params.link_gbps} --seed {params.seed} --json {output} > {log} 2>&1"


rule simulate_pull_encoding:
    """Zen BP with one pull encoding (hash bitmap, COO, bitmap) next to the baselines: Fig 17 data."""
    input:
        BUILD_STAMP,
    output:
        RESULTS + "/bench/pull/{encoding}/{pattern}/n{world_size}_d{density}.jsonl",
    log:
        LOGS + "/simulate_pull_encoding/{encoding}/{pattern}/n{world_size}_d{density}.log",
    benchmark:
        BENCHMARKS + "/simulate_pull_encoding/{encoding}/{pattern}/n{world_size}_d{density}.tsv"
    params:
        numel=config["bench"]["pull"]["numel"],
        link_gbps=config["bench"]["sim"]["link_gbps"],
        schemes=csv_list(config["bench"]["pull"]["schemes"]),
        seed=config["seed"],
    shell:
        "{ZEN} bench --backend sim --world-size {wildcards.world_size} --schemes {params.schemes}"
        " --numel {params.numel} --density {wildcards.density} --pattern {wildcards.pattern}"
        " --pull {wildcards.encoding} --sim-bandwidth-gbps {params.link_gbps} --seed {params.seed}"
        " --json {output} > {log} 2>&1"


rule measure_microbench:
    """Real ranks (gloo or NCCL) on this machine, inside the emulated cluster when it can be built."""
    input:
        BUILD_STAMP,
    output:
        RESULTS + "/bench/{backend}/{pattern}/n{world_size}_d{density}.jsonl",
    log:
        LOGS + "/measure_microbench/{backend}/{pattern}/n{world_size}_d{density}.log",
    benchmark:
        BENCHMARKS + "/measure_microbench/{backend}/{pattern}/n{world_size}_d{density}.tsv"
    threads: lambda wildcards: int(wildcards.world_size)  # one core per rank: keep timings clean
    params:
        numel=config["bench"]["real"]["numel"],
        repeats=config["bench"]["real"]["repeats"],
        warmup=config["bench"]["real"]["warmup"],
        schemes=csv_list(config["schemes"]),
        seed=config["seed"],
        bandwidth=bandwidth_flag(),
    shell:
        "{ZEN} bench --backend {wildcards.backend} --world-size {wildcards.world_size}"
        " --schemes {params.schemes} --numel {params.numel} --density {wildcards.density}"
        " --pattern {wildcards.pattern} --repeats {params.repeats} --warmup {params.warmup}"
        " --seed {params.seed} {params.bandwidth} --json {output} > {log} 2>&1"


rule aggregate_microbench:
    """All microbenchmark rows in one flat CSV per study (one row per scheme x cell)."""
    input:
        lambda wildcards: pull_bench_outputs() if wildcards.study == "pull" else sim_bench_outputs()
        + real_bench_outputs(),
    output:
        AGG + "/{study}.csv",
    log:
        LOGS + "/aggregate_microbench/{study}.log",
    benchmark:
        BENCHMARKS + "/aggregate_microbench/{study}.tsv"
    wildcard_constraints:
        study="microbench|pull",
    shell:
        "{PY} {SCRIPTS}/aggregate.py bench --out {output} {input} > {log} 2>&1"


rule log_bench_wandb:
    """Replay every microbenchmark cell into wandb (offline by default), grouped by run_name."""
    input:
        sim_bench_outputs(),
        real_bench_outputs(),
        pull_bench_outputs(),
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
