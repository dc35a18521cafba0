"""FSDP2 users (`zen train --fsdp`): each cell of config['train_fsdp'] trains a workload sharded by fully_shard
with FSDP's own reduce-scatter (and its bf16 reduce) next to zen.fsdp's, steps interleaved, one launch per cell."""


def fsdp_cells():
    """config['train_fsdp']'s cells by output path (none without that section)."""
    t = config.get("train_fsdp")
    if not t:
        return {}
    return {RESULTS + f"/train_fsdp/{c['workload']}/n{c['world_size']}.json": c for c in t["cells"]}


def fsdp_aggregate():
    """The aggregated FSDP runs, if the config trains any."""
    return [AGG + "/training_fsdp.csv"] if fsdp_cells() else []


def fsdp_flags(wildcards):
    """One cell's preset, schemes and compressor as `zen train` flags."""
    cell = fsdp_cells()[RESULTS + f"/train_fsdp/{wildcards.workload}/n{wildcards.world_size}.json"]
    flags = [f"--preset {cell['preset']}", f"--scheme {csv_list(cell['schemes'])}"]
    if cell.get("compress"):
        flags.append(f"--compress {cell['compress']} --density {cell.get('density', 0.05)}")
        flags += [f"--compress-option {k}={v}" for k, v in cell.get("options", {}).items()]
    return " ".join(flags)


rule train_fsdp:
    """One launch per cell: the workload under FSDP2, every scheme side by side. Timed: alone on the machine."""
    input:
        BUILD_STAMP,
    output:
        RESULTS + "/train_fsdp/{workload}/n{world_size}.json",
    log:
        LOGS + "/train_fsdp/{workload}/n{world_size}.log",
    benchmark:
        BENCHMARKS + "/train_fsdp/{workload}/n{world_size}.tsv"
    threads: workflow.cores  # timed: alone on the machine
    resources:
        nodes=nodes_for,
    params:
        launch=train_launch,
        flags=fsdp_flags,
        steps=lambda wildcards: config["train_fsdp"]["steps"],
        warmup=lambda wildcards: config["train_fsdp"]["warmup"],
        seed=config["seed"],
        backend=config["backend"],
        wandb=wandb_flags(),
    shell:
        "{params.launch} --fsdp --workload {wildcards.workload} {params.flags} --steps {params.steps}"
        " --warmup {params.warmup} --seed {params.seed} --backend {params.backend} {params.wandb} --out {output}"
        " > {log} 2>&1"


rule aggregate_fsdp:
    input:
        lambda wildcards: list(fsdp_cells()),
    output:
        runs=AGG + "/training_fsdp.csv",
        steps=AGG + "/training_fsdp_steps.csv",
    log:
        LOGS + "/aggregate_fsdp.log",
    benchmark:
        BENCHMARKS + "/aggregate_fsdp.tsv"
    shell:
        "{PY} {SCRIPTS}/aggregate.py train --out {output.runs} --steps-out {output.steps} {input} > {log} 2>&1"
