"""End-to-end data-parallel training (`zen train`) per workload x scheme x world size: Fig 11, 15, 18; with
a compressor on the sparse schemes (DGC top-5%): the paper's LLM runs, Figs 13/14; and with the tables sharded by
torchrec's DistributedModelParallel (`--torchrec`), as torchrec users train."""


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


rule train_compressed:
    """Figs 13/14: one launch per (workload, world size) with `train_compressed.compress` on the sparse schemes'
    dense parts, next to uncompressed allreduce and PyTorch's PowerSGD / fp16 hooks. Timed: alone."""
    input:
        BUILD_STAMP,
    output:
        RESULTS + "/train_compressed/{workload}/n{world_size}.json",
    log:
        LOGS + "/train_compressed/{workload}/n{world_size}.log",
    benchmark:
        BENCHMARKS + "/train_compressed/{workload}/n{world_size}.tsv"
    threads: workflow.cores  # timed: alone on the machine
    resources:
        nodes=nodes_for,
    params:
        launch=train_launch,
        schemes=csv_list(config["train_compressed"]["schemes"]),
        preset=config["train_compressed"]["preset"],
        steps=config["train_compressed"]["steps"],
        warmup=config["train_compressed"]["warmup"],
        compress=compress_flags(),
        seed=config["seed"],
        backend=config["backend"],
        wandb=wandb_flags(),
    shell:
        "{params.launch} --workload {wildcards.workload} --preset {params.preset} --scheme {params.schemes}"
        " --steps {params.steps} --warmup {params.warmup} {params.compress} --seed {params.seed}"
        " --backend {params.backend} {params.wandb} --out {output} > {log} 2>&1"


rule aggregate_compressed:
    input:
        train_outputs("train_compressed"),
    output:
        runs=AGG + "/training_compressed.csv",
        steps=AGG + "/training_compressed_steps.csv",
    log:
        LOGS + "/aggregate_compressed.log",
    benchmark:
        BENCHMARKS + "/aggregate_compressed.tsv"
    shell:
        "{PY} {SCRIPTS}/aggregate.py train --out {output.runs} --steps-out {output.steps} {input} > {log} 2>&1"


rule train_torchrec:
    """torchrec users: one launch per (plan, workload, world size) with the workload's tables sharded by torchrec's
    DMP under `plan` (dp: every table data-parallel; mixed: the largest table-wise), Zen through its data-parallel
    wrapper next to torchrec's own wrapping. Timed: alone."""
    input:
        BUILD_STAMP,
    output:
        RESULTS + "/train_torchrec/{plan}/{workload}/n{world_size}.json",
    log:
        LOGS + "/train_torchrec/{plan}/{workload}/n{world_size}.log",
    benchmark:
        BENCHMARKS + "/train_torchrec/{plan}/{workload}/n{world_size}.tsv"
    threads: workflow.cores  # timed: alone on the machine
    resources:
        nodes=nodes_for,
    params:
        launch=train_launch,
        schemes=lambda wildcards: csv_list(config["train_torchrec"]["schemes"]),
        preset=lambda wildcards: config["train_torchrec"]["preset"],
        steps=lambda wildcards: config["train_torchrec"]["steps"],
        warmup=lambda wildcards: config["train_torchrec"]["warmup"],
        interleave=lambda wildcards: "" if config["train_torchrec"].get("interleave", True) else "--no-interleave",
        seed=config["seed"],
        backend=config["backend"],
        wandb=wandb_flags(),
    shell:
        "{params.launch} --workload {wildcards.workload} --torchrec {wildcards.plan} --preset {params.preset}"
        " --scheme {params.schemes} --steps {params.steps} --warmup {params.warmup} {params.interleave}"
        " --seed {params.seed} --backend {params.backend} {params.wandb} --out {output} > {log} 2>&1"


rule aggregate_torchrec:
    input:
        torchrec_outputs(),
    output:
        runs=AGG + "/training_torchrec.csv",
        steps=AGG + "/training_torchrec_steps.csv",
    log:
        LOGS + "/aggregate_torchrec.log",
    benchmark:
        BENCHMARKS + "/aggregate_torchrec.tsv"
    shell:
        "{PY} {SCRIPTS}/aggregate.py train --out {output.runs} --steps-out {output.steps} {input} > {log} 2>&1"


def compressor_outputs():
    """One JSON per (compressor, workload, world size) of config['train_compressors'] (none without that section)."""
    c = config.get("train_compressors")
    if not c:
        return []
    return [RESULTS + f"/train_compressors/{name}/{w}/n{n}.json" for name in c["compressors"]
            for w, sizes in c["grid"].items() for n in sizes]


def compressors_aggregate():
    """The aggregated runs of every compressor, if the config trains them."""
    return [AGG + "/training_compressors.csv"] if compressor_outputs() else []


def compressor_flags(wildcards):
    """One launch's compressor flags: the section's density and the compressor's own options."""
    c = config["train_compressors"]
    return compress_flags({"compress": wildcards.compressor, "density": c["density"],
                           "options": c.get("options", {}).get(wildcards.compressor, {})})


rule train_compressor:
    """Every compressor of `train_compressors` (`all`: every registered one, so a compressor added in one file trains
    here) on the sparse schemes' dense parts, one launch per compressor and cell, next to uncompressed allreduce.
    Timed: alone."""
    input:
        BUILD_STAMP,
    output:
        RESULTS + "/train_compressors/{compressor}/{workload}/n{world_size}.json",
    log:
        LOGS + "/train_compressor/{compressor}/{workload}/n{world_size}.log",
    benchmark:
        BENCHMARKS + "/train_compressor/{compressor}/{workload}/n{world_size}.tsv"
    threads: workflow.cores  # timed: alone on the machine
    resources:
        nodes=nodes_for,
    params:
        launch=train_launch,
        schemes=lambda wildcards: csv_list(config["train_compressors"]["schemes"]),
        preset=lambda wildcards: config["train_compressors"]["preset"],
        steps=lambda wildcards: config["train_compressors"]["steps"],
        warmup=lambda wildcards: config["train_compressors"]["warmup"],
        compress=compressor_flags,
        seed=config["seed"],
        backend=config["backend"],
        wandb=wandb_flags(),
    shell:
        "{params.launch} --workload {wildcards.workload} --preset {params.preset} --scheme {params.schemes}"
        " --steps {params.steps} --warmup {params.warmup} {params.compress} --seed {params.seed}"
        " --backend {params.backend} {params.wandb} --out {output} > {log} 2>&1"


rule aggregate_compressors:
    input:
        compressor_outputs(),
    output:
        runs=AGG + "/training_compressors.csv",
        steps=AGG + "/training_compressors_steps.csv",
    log:
        LOGS + "/aggregate_compressors.log",
    benchmark:
        BENCHMARKS + "/aggregate_compressors.tsv"
    shell:
        "{PY} {SCRIPTS}/aggregate.py train --out {output.runs} --steps-out {output.steps} {input} > {log} 2>&1"
