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
