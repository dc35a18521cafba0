"""Native kernel timings (`zen kernels-bench`): Fig 16, hashing time vs r1 and vs k."""


rule bench_kernels:
    input:
        BUILD_STAMP,
        sorted(Path("zen/native/csrc").glob("*")),  # timings follow the kernel sources
    output:
        RESULTS + "/kernels/sweep_{sweep}.json",
    log:
        LOGS + "/bench_kernels/{sweep}.log",
    benchmark:
        BENCHMARKS + "/bench_kernels/{sweep}.tsv"
    threads: workflow.cores  # a throughput measurement: nothing else runs meanwhile
    params:
        device=config["device"],
        numel=config["kernels"]["numel"],
        density=config["kernels"]["density"],
        servers=config["kernels"]["servers"],
        repeats=config["kernels"]["repeats"],
        seed=config["seed"],
    shell:
        "{ZEN} kernels-bench --device {params.device} --sweep {wildcards.sweep} --numel {params.numel}"
        " --density {params.density} --servers {params.servers} --repeats {params.repeats} --no-reference"
        " --seed {params.seed} --json {output}.tmp > {log} 2>&1 && mv {output}.tmp {output}"


rule aggregate_kernels:
    input:
        kernel_outputs(),
    output:
        AGG + "/kernels.csv",
    log:
        LOGS + "/aggregate_kernels.log",
    benchmark:
        BENCHMARKS + "/aggregate_kernels.tsv"
    shell:
        "{PY} {SCRIPTS}/aggregate.py kernels --out {output} {input} > {log} 2>&1"
