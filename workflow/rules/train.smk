"""End-to-end data-parallel training (`zen train`) per workload x scheme x world size: Fig 11, 15, 18."""


rule train_workload:
    """One launch per (workload, world size): every scheme trained side by side, steps interleaved, so the
    ratios between schemes come from one run. Timed: it takes every core, so no other job runs meanwhile.
    The CLI writes its JSON atomically and logs to wandb under the pipeline's group."""
    input:
        BUILD_STAMP,
    output:
        RESULTS + "/train/{workload}/n{world_size}.json",
    log:
        LOGS + "/train_workload/{workload}/n{world_size}.log",
    benchmark:
        BENCHMARKS + "/train_workload/{workload}/n{world_size}.tsv"
    threads: workflow.cores  # timed: alone on the machine
    resources:
        nodes=nodes_for,
    params:
        launch=train_launch,
        schemes=csv_list(config["train"]["schemes"]),
        preset=config["train"]["preset"],
        steps=config["train"]["steps"],
        warmup=config["train"]["warmup"],
        interleave="" if config["train"].get("interleave", True) else "--no-interleave",
        seed=config["seed"],
        backend=config["backend"],
        wandb=wandb_flags(),
    shell:
        "{params.launch} --workload {wildcards.workload} --preset {params.preset} --scheme {params.schemes}"
        " --steps {params.steps} --warmup {params.warmup} {params.interleave} --seed {params.seed}"
        " --backend {params.backend} {params.wandb} --out {output} > {log} 2>&1"


rule aggregate_training:
    input:
        train_outputs(),
    output:
        runs=AGG + "/training.csv",
        steps=AGG + "/training_steps.csv",
    log:
        LOGS + "/aggregate_training.log",
    benchmark:
        BENCHMARKS + "/aggregate_training.tsv"
    shell:
        "{PY} {SCRIPTS}/aggregate.py train --out {output.runs} --steps-out {output.steps} {input} > {log} 2>&1"
