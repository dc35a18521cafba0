"""Traffic and algorithmic time at 2..128 ranks (`zen scale`): the data of the paper's Figure 8."""


rule predict_scale:
    """Predicted exact per-rank bytes of every scheme (checked against the simulation at small n)."""
    output:
        RESULTS + "/scale/{pattern}_d{density}.csv",
    log:
        LOGS + "/predict_scale/{pattern}_d{density}.log",
    benchmark:
        BENCHMARKS + "/predict_scale/{pattern}_d{density}.tsv"
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


rule predict_scale_trace:
    """Fig 8 on a real workload's sparsity, up to as many ranks as the (at-scale) profile emulated workers."""
    input:
        RESULTS + "/scale/traces/{workload}.pt",
    output:
        RESULTS + "/scale/trace_{workload}.csv",
    log:
        LOGS + "/predict_scale_trace/{workload}.log",
    benchmark:
        BENCHMARKS + "/predict_scale_trace/{workload}.tsv"
    params:
        world_sizes=csv_list(n for n in config["scale"]["world_sizes"] if n <= UNION_WORKERS),
        link_gbps=config["scale"]["link_gbps"],
        schemes=csv_list(config["schemes"]),
        seed=config["seed"],
    shell:
        "{ZEN} scale --schemes {params.schemes} --world-sizes {params.world_sizes} --trace {input}"
        " --seed {params.seed} --bandwidth-gbps {params.link_gbps} --csv {output} > {log} 2>&1"


def emulated_cells(workload):
    """The training cells of `workload` the cluster model also predicts (none on loopback: no link rate)."""
    sizes = config["train"]["grid"].get(workload, [])
    return [n for n in sizes if n <= UNION_WORKERS] if emulated_bandwidth() else []


rule model_cluster:
    """Fig 15 by model: one step's communication on the configured cluster, from the at-scale profile's exact
    bytes (zen cluster), plus the same model at the emulated cluster's training cells."""
    input:
        RESULTS + "/" + UNION_PROFILE + "/{workload}/profile.json",
        RESULTS + "/" + UNION_PROFILE + "/{workload}/traces.pt",
    output:
        RESULTS + "/cluster/{workload}.csv",
    log:
        LOGS + "/model_cluster/{workload}.log",
    benchmark:
        BENCHMARKS + "/model_cluster/{workload}.tsv"
    params:
        c=config.get("cluster", {}),
        schemes=csv_list(s for s in config["schemes"] if s != "bp-without-index"),
        emulated=lambda wildcards: csv_list(emulated_cells(wildcards.workload)),
        folder=lambda wildcards: f"{RESULTS}/{UNION_PROFILE}/{wildcards.workload}",
        rate=emulated_bandwidth() or "1gbit",
        tables=lambda wildcards: (f"--embedding-params {config['cluster']['embedding_params'][wildcards.workload]}"
                                  if wildcards.workload in config.get("cluster", {}).get("embedding_params", {}) else ""),
    shell:
        "{ZEN} cluster --profile {params.folder} --schemes {params.schemes} --nodes {params.c[nodes]}"
        " --gpus-per-node {params.c[gpus_per_node]} --bandwidth {params.c[bandwidth]}"
        " --intra-bandwidth {params.c[intra_bandwidth]} --local-rate {params.c[local_rate]} {params.tables}"
        " $(test -n '{params.emulated}' && echo --emulated {params.emulated} --emulated-bandwidth {params.rate})"
        " --csv {output} > {log} 2>&1"


rule aggregate_cluster:
    input:
        expand(RESULTS + "/cluster/{workload}.csv", workload=config["profile"]["workloads"]),
    output:
        AGG + "/cluster.csv",
    log:
        LOGS + "/aggregate_cluster.log",
    benchmark:
        BENCHMARKS + "/aggregate_cluster.tsv"
    shell:
        "{PY} {SCRIPTS}/aggregate.py concat --out {output} {input} > {log} 2>&1"
