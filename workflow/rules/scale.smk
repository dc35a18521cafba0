"""Traffic and algorithmic time at 2..128 ranks (`zen scale`): the data of the paper's Figure 8."""


rule simulate_scale:
    """Predicted exact per-rank bytes of every scheme (checked against the simulation at small n)."""
    output:
        RESULTS + "/scale/{pattern}_d{density}.csv",
    log:
        LOGS + "/simulate_scale/{pattern}_d{density}.log",
    benchmark:
        BENCHMARKS + "/simulate_scale/{pattern}_d{density}.tsv"
    params:
        numel=config["scale"]["numel"],
        world_sizes=csv_list(config["scale"]["world_sizes"]),
        link_gbps=config["scale"]["link_gbps"],
        schemes=csv_list(config["schemes"]),
        seed=config["seed"],
    shell:
        "{ZEN} scale --schemes {params.schemes} --world-sizes {params.world_sizes} --numel {params.numel}"
        " --density {wildcards.density} --pattern {wildcards.pattern} --seed {params.seed}"
        " --bandwidth-gbps {params.link_gbps} --csv {output} > {log} 2>&1"


rule aggregate_scale:
    input:
        scale_outputs(),
    output:
        AGG + "/scale.csv",
    log:
        LOGS + "/aggregate_scale.log",
    benchmark:
        BENCHMARKS + "/aggregate_scale.tsv"
    shell:
        "{PY} {SCRIPTS}/aggregate.py concat --out {output} {input} > {log} 2>&1"


rule convert_trace:
    """A profiled workload's non-zero rows per worker, in the replay format of `zen scale --trace`."""
    input:
        RESULTS + "/" + UNION_PROFILE + "/{workload}/traces.pt",
    output:
        RESULTS + "/scale/traces/{workload}.pt",
    log:
        LOGS + "/convert_trace/{workload}.log",
    benchmark:
        BENCHMARKS + "/convert_trace/{workload}.tsv"
    shell:
        "{PY} {SCRIPTS}/trace_for_scale.py {input} {output} > {log} 2>&1"


rule simulate_scale_trace:
    """Fig 8 on a real workload's sparsity, up to as many ranks as the (at-scale) profile emulated workers."""
    input:
        RESULTS + "/scale/traces/{workload}.pt",
    output:
        RESULTS + "/scale/trace_{workload}.csv",
    log:
        LOGS + "/simulate_scale_trace/{workload}.log",
    benchmark:
        BENCHMARKS + "/simulate_scale_trace/{workload}.tsv"
    params:
        world_sizes=csv_list(n for n in config["scale"]["world_sizes"] if n <= UNION_WORKERS),
        link_gbps=config["scale"]["link_gbps"],
        schemes=csv_list(config["schemes"]),
        seed=config["seed"],
    shell:
        "{ZEN} scale --schemes {params.schemes} --world-sizes {params.world_sizes} --trace {input}"
        " --seed {params.seed} --bandwidth-gbps {params.link_gbps} --csv {output} > {log} 2>&1"
