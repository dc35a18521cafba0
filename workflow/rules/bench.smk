"""Microbenchmarks (`zen bench`): every scheme on one synthetic gradient per rank (zen/bench)."""


rule simulate_microbench:
    """Virtual ranks in one process: exact bytes per rank, time = max bytes received / link rate."""
    output:
        RESULTS + "/bench/sim/{pattern}/n{world_size}_d{density}.jsonl",
    log:
        LOGS + "/simulate_microbench/{pattern}/n{world_size}_d{density}.log",
    benchmark:
        BENCHMARKS + "/simulate_microbench/{pattern}/n{world_size}_d{density}.tsv"
    params:
        numel=config["bench"]["sim"]["numel"],
        link_gbps=config["bench"]["sim"]["link_gbps"],
        schemes=scheme_list(),
        seed=config["seed"],
    shell:
        "{ZEN} bench --backend sim --world-size {wildcards.world_size} --schemes {params.schemes}"
        " --numel {params.numel} --density {wildcards.density} --pattern {wildcards.pattern}"
        " --sim-bandwidth-gbps {params.link_gbps} --seed {params.seed} --json {output} > {log} 2>&1"


rule measure_microbench:
    """Real ranks (gloo or NCCL) on this machine, inside the emulated cluster when it can be built."""
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
        schemes=scheme_list(),
        seed=config["seed"],
        bandwidth=bandwidth_flag(),
    shell:
        "{ZEN} bench --backend {wildcards.backend} --world-size {wildcards.world_size}"
        " --schemes {params.schemes} --numel {params.numel} --density {wildcards.density}"
        " --pattern {wildcards.pattern} --repeats {params.repeats} --warmup {params.warmup}"
        " --seed {params.seed} {params.bandwidth} --json {output} > {log} 2>&1"


rule aggregate_microbench:
    """All microbenchmark rows in one flat CSV (one row per scheme x cell)."""
    input:
        sim_bench_outputs(),
        real_bench_outputs(),
    output:
        RESULTS + "/aggregate/microbench.csv",
    log:
        LOGS + "/aggregate_microbench.log",
    benchmark:
        BENCHMARKS + "/aggregate_microbench.tsv"
    shell:
        "{PY} {SCRIPTS}/aggregate.py bench --out {output} {input} > {log} 2>&1"
