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


rule profile_at_scale:
    """Many workers (128) from the rows their batches look up, without running the model: seconds, not hours.
    The profile checks its first and last worker against a backward pass."""
    output:
        expand(RESULTS + "/profile_at_scale/{{workload}}/{name}", name=PROFILE_FILES),
    log:
        LOGS + "/profile_at_scale/{workload}.log",
    benchmark:
        BENCHMARKS + "/profile_at_scale/{workload}.tsv"
    params:
        preset=config["profile"]["preset"],
        workers=(AT_SCALE or {}).get("workers"),
        steps=(AT_SCALE or {}).get("steps"),
        seed=config["seed"],
        out=lambda wildcards: f"{RESULTS}/profile_at_scale/{wildcards.workload}",
    shell:
        "{ZEN} profile --workload {wildcards.workload} --preset {params.preset} --workers {params.workers}"
        " --steps {params.steps} --seed {params.seed} --rows-from ids --out {params.out} > {log} 2>&1"


rule aggregate_profiles:
    """Per-workload summary (Table 1), gamma^n per n (from the at-scale profile when there is one), overlap
    pairs and partition shares, as CSVs."""
    input:
        profile_outputs("profile.json"),
        profile_outputs("overlap.csv"),
        profile_outputs("profile.json", UNION_PROFILE),
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
        union_dirs=lambda wildcards: " ".join(f"{RESULTS}/{UNION_PROFILE}/{w}" for w in config["profile"]["workloads"]),
    shell:
        "{PY} {SCRIPTS}/aggregate.py profile --out {output.summary} --union-out {output.union}"
        " --overlap-out {output.overlap} --shares-out {output.shares} --union-dirs {params.union_dirs}"
        " -- {params.dirs} > {log} 2>&1"
