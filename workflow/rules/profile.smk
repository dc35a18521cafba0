"""Embedding-gradient sparsity of real workloads (`zen profile`): Table 1, Fig 2, Fig 3 data."""

PROFILE_FILES = ("profile.json", "workers.csv", "union.csv", "overlap.csv", "traces.pt")


rule profile_sparsity:
    """N data-parallel workers emulated in one process; every file written atomically by the CLI."""
    output:
        expand(RESULTS + "/profile/{{workload}}/{name}", name=PROFILE_FILES),
    log:
        LOGS + "/profile_sparsity/{workload}.log",
    benchmark:
        BENCHMARKS + "/profile_sparsity/{workload}.tsv"
    params:
        preset=config["profile"]["preset"],
        workers=config["profile"]["workers"],
        steps=config["profile"]["steps"],
        seed=config["seed"],
        out=lambda wildcards: f"{RESULTS}/profile/{wildcards.workload}",
    shell:
        "{ZEN} profile --workload {wildcards.workload} --preset {params.preset} --workers {params.workers}"
        " --steps {params.steps} --seed {params.seed} --out {params.out} > {log} 2>&1"


rule aggregate_profiles:
    """Per-workload summary (Table 1), gamma^n per n, overlap pairs and partition shares, as CSVs."""
    input:
        profile_outputs("profile.json"),
        profile_outputs("overlap.csv"),
    output:
        summary=AGG + "/sparsity.csv",
        union=AGG + "/sparsity_union.csv",
        overlap=AGG + "/sparsity_overlap.csv",
        shares=AGG + "/sparsity_shares.csv",
    log:
        LOGS + "/aggregate_profiles.log",
    benchmark:
        BENCHMARKS + "/aggregate_profiles.tsv"
    params:
        dirs=lambda wildcards: " ".join(f"{RESULTS}/profile/{w}" for w in config["profile"]["workloads"]),
    shell:
        "{PY} {SCRIPTS}/aggregate.py profile --out {output.summary} --union-out {output.union}"
        " --overlap-out {output.overlap} --shares-out {output.shares} {params.dirs} > {log} 2>&1"
